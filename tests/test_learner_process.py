"""A learner process SIGKILLed after a checkpoint restarts from it: its step counter (moved to its
peer's phase), inner optimizer and versions continue, it rejoins with those versions and
contributes to merges again."""

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
  ckpt_dir = os.path.join(c.workdir, "learner1", "checkpoints")
  committed = lambda: sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
  c.start()
  # Its saves are asynchronous: under load step 25 can be logged before step 20's save commits
  # (orbax renames the step's folder to its number when it does), so wait for both.
  wait_for(
      lambda: rows()
      and rows()[-1]["step"] >= 25
      and os.path.isdir(ckpt_dir)
      and committed()
      and committed()[-1] >= 20,
      120,
      "learner 1 never reached step 25 with a committed checkpoint at step 20 or later",
  )
  c.kill("learner1")
  killed_at = time.time()
  logged_before = rows()[-1]["step"]
  saved = committed()
  assert saved and saved[-1] >= 20 and all(s % EVERY == 0 for s in saved), saved
  c.start_learner(1)
  assert c.wait(150) == {"sync": 0, "learner0": 0, "learner1": 0}

  starts = read_jsonl(os.path.join(c.workdir, "learner1", "starts.jsonl"))
  assert [s["restored_step"] for s in starts] == [None, saved[-1]]
  assert all(v >= 0 for v in starts[1]["restored_versions"])  # it held every fragment
  assert starts[0]["restored_versions"] == [-1] * 4  # the first start held nothing
  # It resumes where the crash-and-rejoin machine says: the step counter continues from the
  # checkpoint, not from 0, moved to the phase (mod H=8) of learner 0's steps as its last
  # heartbeat reported them, so that its fragments' uploads go with learner 0's again.
  recover, rejoin = read_jsonl(os.path.join(c.workdir, "learner1", "rejoins.jsonl"))
  ((lead,),) = [[p["steps"] for p in recover["peers"]]]
  resumed = recover["resumes_at_step"]
  assert recover["restored_step"] == saved[-1] and resumed == saved[-1] + (lead - saved[-1]) % 8
  # (When it went down, as the synchronizer last heard of it: a long poll (0.5 s) of the killed
  # process still open counts as a sign of life.)
  assert 0 <= recover["steps_lost"] and killed_at - 5.0 <= recover["time"] <= killed_at + 2.0
  assert rejoin["event"] == "rejoin" and rejoin["rejoined"] >= rejoin["back"] > killed_at
  after = [r for r in rows() if r["time"] > killed_at]
  assert saved[-1] <= logged_before + 4
  first = resumed + 5 - resumed % 5  # (log_every=5)
  assert [r["step"] for r in after] == list(range(first, 81, 5)), (after, recover)
  assert all(np.isfinite(r["loss"]) for r in after)
  summary = _json(os.path.join(c.workdir, "learner1", "summary.json"))
  assert summary["steps"] == 80 and summary["settled"]
  assert summary["restored_step"] == saved[-1] and summary["joins"] >= 1
  assert summary["rejoin"] == {k: v for k, v in rejoin.items() if k != "event"}
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


def _after(c: local.LocalCluster, t: float) -> dict:
  """The synchronizer's events from wall time `t` on and each process's last log lines: a
  failure's evidence, as a CI run keeps no workdir."""
  rows = read_jsonl(os.path.join(c.workdir, "sync", "metrics.jsonl"))
  out = {"sync": [r for r in rows if r.get("event") and r.get("wall_time", 0) > t]}
  for name in ("sync", "learner0", "learner1"):
    with open(os.path.join(c.workdir, "logs", f"{name}.log")) as f:
      out[name + ".log"] = f.read().splitlines()[-25:]
  return out


def test_learners_whose_synchronizer_stays_away_save_say_what_and_deliver_after_a_restart(
    tmp_path,
):
  """Issue 49, point 3: the synchronizer is SIGKILLed mid-run and stays away longer than
  deploy.deliver_timeout_s. The learners train to the end, keep their progress, name what was
  not delivered and exit 75 with it saved; started again once the synchronizer is back, they
  deliver it (before, they exited 0, settled=False, and that work was lost)."""
  c = local.LocalCluster(
      CONFIG,
      2,
      str(tmp_path / "run"),
      overrides=(
          f"--config.outer.learner_checkpoint_every={EVERY}",
          "--config.deploy.deliver_timeout_s=3",
      ),
  )
  try:
    rows = lambda m: read_jsonl(os.path.join(c.workdir, f"learner{m}", "progress.jsonl"))
    c.start()

    # Each learner is frozen (SIGSTOP) once its log reaches step 25, until both have; the
    # synchronizer is killed and both go on: each has most of its 80 steps left to train
    # unreachable, whatever their speeds (with the faster alone at 25, a loaded machine had
    # learner 1 at 75 and learner 0 at 5, and learner 1 trained its last 5 before noticing).
    frozen = set()

    def both_at_25() -> bool:
      for m in {0, 1} - frozen:
        if max((r["step"] for r in rows(m)), default=-1) >= 25:
          c.freeze(f"learner{m}")
          frozen.add(m)
      return frozen == {0, 1}

    try:
      wait_for(both_at_25, 120, "step 25")
      at_kill = {m: rows(m)[-1]["step"] for m in (0, 1)}  # (as far as their logs had got)
      c.kill("sync")
    finally:
      for m in frozen:
        c.thaw(f"learner{m}")
    codes = c.wait(120)
    assert codes == {"sync": -9, "learner0": 75, "learner1": 75}, codes
    held, s_unreachable = {}, {}
    for m in (0, 1):
      s = _json(os.path.join(c.workdir, f"learner{m}", "summary.json"))
      # Most of what was left after the kill was trained unreachable (its log, and noticing the
      # outage, lag a few steps).
      assert s["steps"] == 80 and not s["settled"], s
      assert s["unreachable_steps"] >= (80 - at_kill[m]) // 2 > 0, (
          m,
          at_kill,
          s["unreachable_steps"],
      )
      # Every fragment fell due while it was away (H=8): all four are named, each with at
      # least the steps trained since the kill.
      assert sorted(s["undelivered_steps"]) == ["0", "1", "2", "3"], s["undelivered_steps"]
      assert min(s["undelivered_steps"].values()) >= s["unreachable_steps"]
      saved = os.listdir(os.path.join(c.workdir, f"learner{m}", "checkpoints"))
      assert "80" in saved
      with open(os.path.join(c.workdir, "logs", f"learner{m}.log")) as f:
        log = f.read()
      assert "did not take this progress within deploy.deliver_timeout_s=3 s" in log
      assert "saved at step 80: a restart delivers it; exiting 75" in log
      held[m], s_unreachable[m] = s["undelivered_steps"], s["unreachable_steps"]
    # Started again, each waits for the other to deliver too: 3 s was the whole window, and on a
    # loaded machine one process reached its Join 2.85 s after the other (its Python and JAX
    # start: the restore took 0.1 to 0.25 s, with synchronous saves and asynchronous alike).
    kept = [o for o in c.overrides if "deliver_timeout_s" not in o]
    c.overrides = (*kept, "--config.deploy.deliver_timeout_s=30")
    restarted_at = time.time()
    c.start_sync()
    for m in (0, 1):
      c.start_learner(m)
    assert c.wait(150) == {"sync": 0, "learner0": 0, "learner1": 0}, _after(c, restarted_at)
    merges = [
        r
        for r in read_jsonl(os.path.join(c.workdir, "sync", "metrics.jsonl"))
        if r.get("event") == "merge" and r["wall_time"] > restarted_at
    ]
    # What each held went into a merge after the restart: whole, or, where its last upload
    # before the kill had been merged (a copy refused as a duplicate), the steps after it.
    for m in (0, 1):
      s = _json(os.path.join(c.workdir, f"learner{m}", "summary.json"))
      assert s["restored_step"] == 80 and s["undelivered_steps"] == {} and s["settled"], (
          s,
          _after(c, restarted_at),
      )
      for p, n in held[m].items():
        sent = [k for r in merges if r["fragment"] == int(p) for l, k in zip(r["learners"], r["steps"]) if l == m]  # fmt: skip
        assert sent and max(sent) <= n and max(sent) >= s_unreachable[m], (
            (m, p, n, sent),
            _after(c, restarted_at),
        )
    # The summary counts the steps trained while the synchronizer was away (reported by no
    # heartbeat: the restarted processes start at 80) and the merges of both generations.
    work = _json(os.path.join(c.workdir, "sync", "summary.json"))["learners"]
    assert [work[m]["trained_steps"] for m in "01"] == [80, 80], work
    assert all(0 < work[m]["merged_share"] <= 1 for m in "01"), work
  finally:
    c.stop(grace_s=2.0)
