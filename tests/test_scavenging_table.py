"""The scavenging table's arithmetic (experiments/studies/scavenging_table.py), with numbers worked out
by hand, and its sweep file's runs (configs/sweeps/scavenging.py)."""

import pytest

from configs.sweeps import scavenging
from diloco.config import checks
from experiments.studies import scavenging_table as st

CURVE = [{"sim_time_s": 0.0, "eval_loss": 3.0}, {"sim_time_s": 10.0, "eval_loss": 2.0},
         {"sim_time_s": 20.0, "eval_loss": 1.5}]  # fmt: skip


def test_time_to_a_loss_is_linear_between_evaluations():
  assert st.time_to(CURVE, 1.75) == pytest.approx(15.0)  # 10 + (2 - 1.75) / 0.5 x 10
  assert st.time_to(CURVE, 2.0) == 10.0
  assert st.time_to(CURVE, 3.5) == 0.0
  assert st.time_to(CURVE, 1.4) is None


def test_data_parallel_speeds_up_with_its_chips_and_pauses_at_each_change():
  window = (250.0, 750.0)
  assert st.dp_time(1000.0, 0, window, 9.25) == 1000.0
  # +1 unit of 4: 1.25x from 259.25 to 750 (613.4375 s of work), paused again, 136.5625 left.
  assert st.dp_time(1000.0, 1, window, 9.25) == pytest.approx(895.8125)
  # +12: 4x, the 750 s left done by 259.25 + 187.5, before they leave.
  assert st.dp_time(1000.0, 12, window, 9.25) == pytest.approx(446.75)
  # Break-even at +1: 1000 + 500 (1 - 1.25) + p (1 + 1.25) = 1000, p = 125 / 2.25.
  assert st.break_even_pause(1000.0, 1, window) == pytest.approx(55.5556, abs=1e-3)
  # At +12 the work ends in the window while 500 - p >= 187.5 (750 / 4); past that it pays the
  # pause of their leaving too (1062.5 s): the break-even is that jump, p = 312.5.
  assert st.break_even_pause(1000.0, 12, window) == pytest.approx(312.5, abs=1e-6)
  with pytest.raises(ValueError, match="does not fit in the window"):
    st.dp_time(1000.0, 1, window, 600.0)


def test_relative_times_and_the_table_beside_the_published_rows():
  scav = [{"sim_time_s": 0.0, "eval_loss": 3.0}, {"sim_time_s": 100.0, "eval_loss": 1.8},
          {"sim_time_s": 150.0, "eval_loss": 1.4}]  # fmt: skip
  base = [dict(p, sim_time_s=10 * p["sim_time_s"]) for p in CURVE]  # reaches 1.5 at 200
  rows = [
      {"extra": 0, "seed": 0, "eval_loss": 1.5, "eval_curve": base},
      {"extra": 1, "seed": 0, "eval_loss": 1.4, "eval_curve": scav},
      {"extra": 2, "seed": 0, "eval_loss": 1.6, "eval_curve": base[:2]},  # never there
  ]
  rel = st.relative_times(rows)
  # 100 + (1.8 - 1.5) / 0.4 x 50 = 137.5, over 200.
  assert rel == {0: [1.0], 1: [pytest.approx(0.6875)], 2: [None]}
  text = st.table(rows, 1000.0, (250.0, 750.0))
  assert "| +1 (+25%) | 0.688 ± 0.000 (0.688) | 0.90 | 0.896 | 1.07 | 56 s |" in text
  assert "| +2 (+50%) | nan ± nan (never) | 0.83 |" in text


def test_the_sweep_lends_extra_learners_for_the_middle_half_of_the_run():
  c = scavenging.get_config("extra=2")
  assert c.outer.learners == 6 and c.sim.speeds == "1,1,1.18,1.18,1,1"
  assert (c.sim.start_times, c.sim.stop_times) == ("0,0,0,0,250,250", "0,0,0,0,750,750")
  assert (c.sim.join_schedule, c.sim.time_limit_s, c.eval_every) == ("clock", 1200.0, 8)
  assert c.data.eval_sequences == c.data.final_eval_sequences == 1024  # one evaluation set
  checks.prepare(c)
  base = scavenging.get_config("extra=0")
  assert (base.outer.learners, base.sim.start_times, base.sim.time_limit_s) == (4, "", 0.0)
  assert len(scavenging.get_sweep("seeds=3")) == 15
