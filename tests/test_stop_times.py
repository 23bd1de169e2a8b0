"""Learners that join for a stretch of a run (sim.start_times, sim.stop_times: the scavenging
table's extra learners): a learner starts no step after its stop time and leaves, and the others
go on without it; sim.join_schedule says where its learning-rate schedule starts."""

import json
import os

import pytest

from configs import shakespeare
from diloco import train
from diloco.config import checks


def _config(**sim):
  c = shakespeare.get_config("runlocal,mode=decoupled,learners=3")
  c.update_from_flattened_dict({"steps": 24, "timeline": False, "log_every": 1, **sim})
  return c


def _first_lrs(workdir: str, m: int) -> list[float]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  return [r["lr"] for r in rows if r.get("learner") == m and "lr" in r][:2]


def test_a_learner_joins_late_leaves_at_its_stop_time_and_the_run_goes_on(tmp_path):
  s = train.train_and_evaluate(
      _config(**{"sim.start_times": "0,0,6", "sim.stop_times": "0,0,14"}), str(tmp_path)
  )
  # 1 s steps from t = 6.2 (its Join answered over 0.1 s links), none started at or after
  # t = 14: 8. The budget of 3 x 24 steps is trained by the other two after it left.
  assert [r["steps"] for r in s["per_learner"]] == [32, 32, 8]
  assert s["finished"] and s["sim_time_s"] > 32
  # It joins the synchronizer when it starts (not live before: no round waits for it), and its
  # schedule starts at its first step (join_schedule=own): warmup from lr 0.
  with open(os.path.join(tmp_path, "metrics.jsonl"), encoding="utf-8") as f:
    joins = [r for r in map(json.loads, f) if r.get("event") == "join" and r["learner"] == 2]
  assert [r["time"] for r in joins] == [pytest.approx(6.1)]
  assert _first_lrs(str(tmp_path), 2) == [0.0, pytest.approx(0.002)]


def test_a_late_learner_can_start_its_schedule_where_the_clock_is(tmp_path):
  times = {"sim.start_times": "0,0,6", "sim.stop_times": "0,0,14"}
  train.train_and_evaluate(_config(**times, **{"sim.join_schedule": "clock"}), str(tmp_path))
  # Started at t = 6 with 1 s steps: its schedule at count 6, past the 5 warmup steps on the
  # cosine over 19: lr 0.01 (0.1 + 0.9 (1 + cos(pi k / 19)) / 2) for k = 1, 2.
  assert _first_lrs(str(tmp_path), 2) == [pytest.approx(0.0099386, abs=1e-7),
                                          pytest.approx(0.0097562, abs=1e-7)]  # fmt: skip


def test_stop_times_are_checked():
  with pytest.raises(checks.ConfigError, match=r"sim.stop_times.*learners \[2\] would stop before"):
    checks.prepare(_config(**{"sim.start_times": "0,0,6", "sim.stop_times": "0,0,5"}))
  with pytest.raises(checks.ConfigError, match=r"sim.stop_times.*>= 0"):
    checks.prepare(_config(**{"sim.stop_times": "0,0,-1"}))
  with pytest.raises(checks.ConfigError, match=r"sim.join_schedule.*expected own or clock"):
    checks.prepare(_config(**{"sim.join_schedule": "global"}))
