"""The gRPC runtime: a synchronizer and learner processes on loopback, with real SIGKILLs."""

import json
import os
import time

import numpy as np
import pytest
from proc_helpers import read_jsonl, wait_for

from configs import shakespeare
from diloco.config import build
from diloco.recovery import sync_checkpoint
from diloco.rpc import local, sync_main
from diloco.runners import islands as islands_lib

CHAOS = "configs/shakespeare.py:mode=decoupled,runlocal,learners=3,steps=60"
FRAGMENTS, INNER_STEPS = 4, 8  # what CHAOS resolves to (outer.fragments, outer.inner_steps)
SYNCHRONOUS = "configs/shakespeare.py:mode=diloco,runlocal,learners=2,steps=20"


@pytest.fixture
def cluster_factory(tmp_path):
  made = []

  def make(config, learners, **kw):
    c = local.LocalCluster(config, learners, str(tmp_path / f"run{len(made)}"), **kw)
    made.append(c)
    return c

  yield make
  for c in made:  # always: nothing outlives the test
    c.stop(grace_s=2.0)


def _summary(c, name):
  with open(os.path.join(c.workdir, name, "summary.json")) as f:
    return json.load(f)


def _steps(c, m):
  path = os.path.join(c.workdir, f"learner{m}", "progress.jsonl")
  return read_jsonl(path)[-1]["step"] if os.path.exists(path) and read_jsonl(path) else 0


def test_three_learners_survive_learner_and_synchronizer_kills(cluster_factory):
  c = cluster_factory(CHAOS, 3)
  c.start()
  # SIGKILL learner 1 mid-run and start it again.
  wait_for(lambda: _steps(c, 1) >= 15, 120, "learner 1 never reached step 15")
  c.kill("learner1")
  killed_at = time.time()
  others_at_kill = [_steps(c, m) for m in (0, 2)]
  c.start_learner(1)
  # SIGKILL the synchronizer once learner 1 trains again, and start it from its checkpoint.
  # (Learners train on meanwhile; the tiny model's steps are so short without uploads that
  # they usually finish before the synchronizer is back, then rejoin to fetch the globals.)
  wait_for(lambda: _steps_between(c, 1, killed_at) >= 2, 120, "restarted learner 1 never trained")
  c.kill("sync")
  ckpt = sync_checkpoint.SyncCheckpointer(
      os.path.join(c.workdir, "sync", "checkpoints", "synchronizer")
  )
  config = shakespeare.get_config(CHAOS.split(":", 1)[1])
  last = ckpt.restore(sync_main.make_synchronizer(config).state_dict())
  last_step = ckpt.latest_step()
  ckpt.close()
  restarted_at = time.time()
  c.start_sync()
  codes = c.wait(150)
  assert codes == {"sync": 0, "learner0": 0, "learner1": 0, "learner2": 0}, codes

  sync = _summary(c, "sync")
  assert sync["restored_from"] == last_step and sync["generation"] == 1
  assert sync["restored_digest"] == sync_main.arrays_digest(last)
  assert sync["restored_arrays_equal"]
  learners = [_summary(c, f"learner{m}") for m in range(3)]
  assert all(s["settled"] and s["steps"] == 60 for s in learners)
  # The others never stopped: those not finished yet trained while learner 1 was down (on a
  # loaded machine one may finish all 60 steps before learner 1 reaches 15), and every learner
  # reconnected after the synchronizer restart (a second join).
  running = [m for m, s in zip((0, 2), others_at_kill) if s < 60]
  assert all(_steps_between(c, m, killed_at) > 0 for m in running), others_at_kill
  assert all(s["joins"] >= 2 for s in learners), [s["joins"] for s in learners]
  # After the last broadcast every learner holds the same global parameters as the synchronizer.
  assert len({s["global_crc"] for s in learners}) == 1
  assert all(s["versions"] == sync["versions"] for s in learners)
  held = np.load(os.path.join(c.workdir, "learner0", "global_copy.npz"))
  assert all(np.isfinite(held[k]).all() for k in held.files)
  merges = [
      r
      for r in read_jsonl(os.path.join(c.workdir, "sync", "metrics.jsonl"))
      if r.get("event") == "merge"
  ]
  assert len(merges) > 10
  # The restarted learner contributed again to merges after its restart.
  assert any(1 in r["learners"] and r["wall_time"] > killed_at + 1 for r in merges)
  # Issue 49, point 3: nothing a learner trained while the synchronizer was away is dropped.
  # Before, a learner that finished during the outage (the usual case here) rejoined, sent
  # nothing and settled: its work since the kill never reached the global model. Now every
  # fragment that fell due meanwhile is sent at the Join, carrying at least those steps.
  # (Or it is refused, and says so: the outlier screen may take the large delta of a long outage
  # for a poisoned one; the learner's summary counts those steps under `refused_steps`.)
  log = read_jsonl(os.path.join(c.workdir, "sync", "metrics.jsonl"))
  post = [r for r in merges if r["wall_time"] > restarted_at]
  screened = {(r["learner"], r["fragment"]) for r in log
              if r.get("event") == "reject" and r["code"] == "outlier"}  # fmt: skip
  for m, s in enumerate(learners):
    assert s["undelivered_steps"] == {}, (m, s["undelivered_steps"])
    if s["unreachable_steps"] >= INNER_STEPS:  # every fragment fell due while it was away
      for p in range(FRAGMENTS):
        sent = [n for r in post if r["fragment"] == p for l, n in zip(r["learners"], r["steps"])
                if l == m]  # fmt: skip
        ok = sent and max(sent) >= s["unreachable_steps"]
        assert ok or ((m, p) in screened and s["refused_steps"].get("outlier")), (m, p, sent, s)
  assert any(s["unreachable_steps"] >= INNER_STEPS for s in learners)  # (the case was tried)
  # The summary says how much of each learner's work reached the global model, counted over
  # both generations (the counts live in the synchronizer's checkpoints).
  work = sync["learners"]
  assert sorted(work) == ["0", "1", "2"] and sync["merges"] == sum(sync["versions"])
  # Learner 1's two processes (the first killed, no checkpoint) both count.
  assert [work[m]["trained_steps"] > 60 for m in "012"] == [False, True, False]
  for m in range(3):
    steps = work[str(m)]["merged_steps"]
    assert work[str(m)]["trained_steps"] >= 60
    trained = work[str(m)]["trained_steps"]
    assert 0 < work[str(m)]["merged_share"] == sum(steps.values()) / (FRAGMENTS * trained) <= 1
  merged_in_log = sum(n for r in merges for l, n in zip(r["learners"], r["steps"]) if l == 0)
  # (The log also holds merges that the kill lost before their checkpoint.)
  assert 0 < sum(work["0"]["merged_steps"].values()) <= merged_in_log
  # Bytes on the wire (serialized gRPC messages, counted since the restart) exceed the codec's
  # own payload counts (which may be 0 here: learners finished while it was down).
  assert sync["wire_bytes_received"] > sync["codec_bytes_received"], sync
  assert sync["wire_bytes_sent"] > sync["codec_bytes_sent"], sync


def _steps_between(c, m, since):
  rows = read_jsonl(os.path.join(c.workdir, f"learner{m}", "progress.jsonl"))
  return sum(1 for r in rows if r["time"] > since)


def test_grpc_matches_virtual_in_the_synchronous_setting(cluster_factory, tmp_path):
  config = shakespeare.get_config(SYNCHRONOUS.split(":", 1)[1])
  parts = build.local_learners(config)
  islands_lib.run(config, str(tmp_path / "virtual"), parts=parts)
  virtual = parts.syncs[0].global_params()
  # Each learner process gets as many (fake) devices as its island has in the virtual run.
  c = cluster_factory(SYNCHRONOUS, 2, devices_per_learner=4)
  c.start()
  assert c.wait(150) == {"sync": 0, "learner0": 0, "learner1": 0}
  frag_of = {k: p for p, paths in enumerate(parts.syncs[0].frag.paths) for k in paths}
  for m in range(2):
    held = np.load(os.path.join(c.workdir, f"learner{m}", "global_copy.npz"))
    # K = all, blocking, tau = 0: bit-identical to the virtual runtime (tolerance 0).
    for k, v in virtual.items():
      np.testing.assert_array_equal(held[f"{frag_of[k]}/{k}"], v)
  sync = _summary(c, "sync")
  assert sync["merges"] == 2
  # Wire bytes (serialized gRPC messages) vs the codec's payload bytes: two fp32 uploads of the
  # whole model per merge, plus framing; sends: the initial full values and two updates each.
  assert sync["wire_bytes_received"] > sync["codec_bytes_received"] > 0
  assert sync["codec_bytes_received"] == 2 * 2 * 4 * sum(v.size for v in virtual.values())
  assert sync["wire_bytes_sent"] > sync["codec_bytes_sent"] > 0
  for m in range(2):  # each learner's own counts: its two fp32 uploads, and what it got
    mine = _summary(c, f"learner{m}")
    assert mine["codec_bytes_sent"] == 2 * 4 * sum(v.size for v in virtual.values())
    assert mine["wire_bytes_sent"] > mine["codec_bytes_sent"]
    assert mine["wire_bytes_received"] > mine["codec_bytes_received"] > 0
