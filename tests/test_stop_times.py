"""Learners that join for a stretch of a run (sim.start_times, sim.stop_times: the scavenging
table's extra learners): a learner starts no step after its stop time and leaves, and the others
go on without it."""

import pytest

from configs import shakespeare
from diloco import train
from diloco.config import checks


def _config(**sim):
  c = shakespeare.get_config("runlocal,mode=decoupled,learners=3")
  c.update_from_flattened_dict({"steps": 24, "timeline": False, **sim})
  return c


def test_a_learner_joins_late_leaves_at_its_stop_time_and_the_run_goes_on(tmp_path):
  s = train.train_and_evaluate(
      _config(**{"sim.start_times": "0,0,6", "sim.stop_times": "0,0,14"}), str(tmp_path)
  )
  # 1 s steps from just after t = 6 (its Join answered over 0.1 s links), none started at or
  # after t = 14: 8. The budget of 3 x 24 steps is trained by the other two after it left.
  assert [r["steps"] for r in s["per_learner"]] == [32, 32, 8]
  assert s["finished"] and s["sim_time_s"] > 32


def test_stop_times_are_checked():
  with pytest.raises(checks.ConfigError, match=r"sim.stop_times.*learners \[2\] would stop before"):
    checks.prepare(_config(**{"sim.start_times": "0,0,6", "sim.stop_times": "0,0,5"}))
  with pytest.raises(checks.ConfigError, match=r"sim.stop_times.*>= 0"):
    checks.prepare(_config(**{"sim.stop_times": "0,0,-1"}))
