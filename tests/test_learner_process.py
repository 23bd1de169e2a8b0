"""A learner process SIGKILLed after a checkpoint restarts from it: its step counter, inner
optimizer and versions continue, it rejoins with those versions and contributes to merges again."""

import json
import os
import signal
import time

import numpy as np
import pytest
from proc_helpers import read_jsonl, wait_for

from diloco.rpc import local
from diloco.runtime import preemption

CONFIG = "configs/shakespeare.py:mode=decoupled,runlocal,learners=2,steps=80"
EVERY = 10


@pytest.fixture
def cluster(tmp_path):
  c = local.LocalCluster(
      CONFIG,
      2,
      str(tmp_path / "run"),
      overrides=(f"--config.outer.learner_checkpoint_every={EVERY}",),
  )
  yield c
  c.stop(grace_s=2.0)


def _json(path):
  with open(path) as f:
    return json.load(f)


def test_killed_learner_resumes_from_its_checkpoint(cluster):
  c = cluster
  rows = lambda: read_jsonl(os.path.join(c.workdir, "learner1", "progress.jsonl"))
  c.start()
  wait_for(lambda: rows() and rows()[-1]["step"] >= 25, 120, "learner 1 never reached step 25")
  c.kill("learner1")
  killed_at = time.time()
  logged_before = rows()[-1]["step"]
  ckpt_dir = os.path.join(c.workdir, "learner1", "checkpoints")
  saved = sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
  assert saved and saved[-1] >= 20 and all(s % EVERY == 0 for s in saved), saved
  c.start_learner(1)
  assert c.wait(150) == {"sync": 0, "learner0": 0, "learner1": 0}

  starts = read_jsonl(os.path.join(c.workdir, "learner1", "starts.jsonl"))
  assert [s["restored_step"] for s in starts] == [None, saved[-1]]
  assert all(v >= 0 for v in starts[1]["restored_versions"])  # it held every fragment
  assert starts[0]["restored_versions"] == [-1] * 4  # the first start held nothing
  after = [r for r in rows() if r["time"] > killed_at]
  # The step counter continues from the checkpoint (log_every=5), not from 0.
  assert after[0]["step"] == saved[-1] + 5, (after[0], saved)
  assert saved[-1] <= logged_before + 4
  assert [r["step"] for r in after] == list(range(saved[-1] + 5, 81, 5))
  assert all(np.isfinite(r["loss"]) for r in after)
  summary = _json(os.path.join(c.workdir, "learner1", "summary.json"))
  assert summary["steps"] == 80 and summary["settled"]
  assert summary["restored_step"] == saved[-1] and summary["joins"] >= 1
  # It contributed to merges again after the restart, and every learner ends on the
  # synchronizer's versions.
  merges = [
      r
      for r in read_jsonl(os.path.join(c.workdir, "sync", "metrics.jsonl"))
      if r.get("event") == "merge"
  ]
  assert any(1 in r["learners"] and r["wall_time"] > killed_at for r in merges)
  sync = _json(os.path.join(c.workdir, "sync", "summary.json"))
  assert summary["versions"] == sync["versions"]


def test_a_started_process_keeps_the_parents_xla_flags_with_its_own_device_count():
  # The learner and synchronizer processes compile with the flags of the process that starts
  # them (the tests' -O0: a learner at another level drifts by an ulp from the in-process run).
  flags = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
  assert local.xla_flags(4, flags) == (
      "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=4"
  )
  assert local.xla_flags(2, "") == "--xla_force_host_platform_device_count=2"


def test_sigterm_saves_the_learner_at_its_step_and_exits_75(cluster):
  """Issue 49, point 5: before, a SIGTERMed gRPC learner exited 0 with no checkpoint at the stop,
  and the supervisor, which ends its loop on 0, did not restart it."""
  c = cluster
  rows = lambda: read_jsonl(os.path.join(c.workdir, "learner1", "progress.jsonl"))
  c.start()
  wait_for(lambda: rows() and rows()[-1]["step"] >= 25, 120, "learner 1 never reached step 25")
  proc = c.procs["learner1"]
  os.killpg(proc.pid, signal.SIGTERM)
  assert proc.wait(60) == preemption.EXIT_PREEMPTED
  stopped = _json(os.path.join(c.workdir, "learner1", "summary.json"))
  assert stopped["stopped_by"] == "signal" and stopped["saved_at_stop"]
  ckpt_dir = os.path.join(c.workdir, "learner1", "checkpoints")
  saved = sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
  assert saved[-1] == stopped["steps"] >= 25  # its own step, not the last multiple of EVERY
  c.start_learner(1)
  assert c.wait(150) == {"sync": 0, "learner0": 0, "learner1": 0}
  starts = read_jsonl(os.path.join(c.workdir, "learner1", "starts.jsonl"))
  assert [s["restored_step"] for s in starts] == [None, stopped["steps"]]
  assert _json(os.path.join(c.workdir, "learner1", "summary.json"))["steps"] == 80
