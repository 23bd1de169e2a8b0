"""One learner as a 2-process JAX job (CPU, gloo collectives) against a synchronizer process: only
process 0 talks to the synchronizer, process 1 follows it, both checkpoint together and, SIGKILLed
and started again, resume from that checkpoint; both end with identical parameters, equal to the
synchronizer's global parameters after the last merge. (A non-blocking learner of 4 processes, its
arrivals held to sync points: tests/test_island_bucket.py.)"""

import json
import os
import time

import numpy as np
import pytest
from proc_helpers import only_at_sync_points

from configs import shakespeare
from diloco.recovery import sync_checkpoint
from diloco.rpc import local, multihost, sync_main

# Synchronous DiLoCo, H=10, alpha=0: after the last merge arrives every parameter is the global one.
SPEC = "configs/shakespeare.py:mode=diloco,runlocal,learners=1,steps=30"
EVERY = 10


@pytest.fixture
def cluster(tmp_path):
  c = local.LocalCluster(
      SPEC,
      1,
      str(tmp_path / "run"),
      devices_per_learner=2,
      processes_per_learner=2,
      overrides=(
          f"--config.outer.learner_checkpoint_every={EVERY}",
          # data=2 x fsdp=2: parameters sharded within each process,
          # not addressable from one process (read by allgather)
          "--config.mesh.fsdp=2",
      ),
  )
  yield c
  c.stop(grace_s=2.0)


def _json(path):
  with open(path) as f:
    return json.load(f)


def _tail(path):
  with open(path) as f:
    return f.read()[-2000:]


def _last_step(c):
  path = os.path.join(c.workdir, "learner0", "progress.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return rows[-1]["step"] if rows else 0


def test_two_process_learner_follows_process_zero(cluster):
  c = cluster
  c.start()
  deadline = time.monotonic() + 180
  while _last_step(c) < 15:
    assert time.monotonic() < deadline, "the 2-process learner never reached step 15"
    assert c.alive("learner0") and c.alive("learner0.p1")
    time.sleep(0.05)
  c.kill("learner0")  # both of its processes
  assert not c.alive("learner0.p1")
  ckpt_dir = os.path.join(c.workdir, "learner0", "checkpoints")
  saved = max(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
  assert saved in (10, 20)
  c.start_learner(0)
  codes = c.wait(240)
  logs = {n: _tail(os.path.join(c.workdir, "logs", f"{n}.log")) for n in c.procs}
  assert codes == {"sync": 0, "learner0": 0, "learner0.p1": 0}, (codes, logs)
  lead = _json(os.path.join(c.workdir, "learner0", "summary.json"))
  follower = _json(os.path.join(c.workdir, "learner0", "summary.process1.json"))
  # One island over both processes' devices; process 1 never connected anywhere.
  assert (lead["processes"], lead["devices"], lead["process"]) == (2, 4, 0)
  assert lead["params_sharded"] > 0  # some parameters were gathered across the processes
  assert (follower["role"], follower["process"], follower["steps"]) == ("follower", 1, 30)
  assert lead["steps"] == 30 and lead["settled"]
  # Both processes resumed from the same checkpoint, then the follower took every step after it,
  # computed every upload (one per H=10 steps), applied what process 0 applied, and ended.
  assert lead["restored_step"] == follower["restored_step"] == saved
  ops = follower["ops"]
  assert (ops["step"], ops["upload"], ops["end"]) == (30 - saved, (30 - saved) // EVERY, 1)
  assert ops["receive"] == lead["applied"] >= (30 - saved) // EVERY
  # Cross-process calls outside the train step only at sync points (every H=10 steps here): one
  # RUN broadcast per interval, not one per step.
  assert ops["run"] == (30 - saved) // EVERY
  only_at_sync_points(lead)
  only_at_sync_points(follower)
  sync = _json(os.path.join(c.workdir, "sync", "summary.json"))
  assert sync["merges"] == 3 and lead["versions"] == sync["versions"] == [3]

  p0 = np.load(os.path.join(c.workdir, "learner0", "params.process0.npz"))
  p1 = np.load(os.path.join(c.workdir, "learner0", "params.process1.npz"))
  assert sorted(p0.files) == sorted(p1.files) and lead["params_crc"] == follower["params_crc"]
  config = shakespeare.get_config(SPEC.split(":", 1)[1])
  made = sync_main.make_synchronizer(config)
  ckpt = sync_checkpoint.SyncCheckpointer(
      os.path.join(c.workdir, "sync", "checkpoints", "synchronizer")
  )
  made.load_state_dict(ckpt.restore(made.state_dict()))
  ckpt.close()
  final = made.global_params()
  assert made.merges == 3 and sorted(final) == sorted(p0.files)
  start = sync_main.make_synchronizer(config).global_params()
  for k, v in final.items():
    np.testing.assert_array_equal(p0[k], p1[k])  # identical on both processes
    np.testing.assert_array_equal(p0[k], v)  # and equal to the synchronizer's broadcast
  assert any(not np.array_equal(final[k], start[k]) for k in final)  # training moved them


def test_cluster_flags_are_checked():
  with pytest.raises(ValueError, match="--num_processes >= 1 and --process_id"):
    multihost.initialize(False, "127.0.0.1:1", 2, 2)
  multihost.initialize(False)  # nothing to do for a single-process learner


def test_the_heartbeat_bound_on_a_dead_process_is_a_setting(monkeypatch):
  """How long the others wait for a process that died (issue 70: 1 to 2 minutes, JAX's 100 s
  heartbeat, with no way to change it) is --heartbeat_timeout_s, handed to JAX's coordinator."""
  calls = []
  monkeypatch.setattr(multihost.jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(multihost.jax.config, "update", lambda *a: None)
  multihost.initialize(True, "127.0.0.1:1", 2, 1, heartbeat_s=7)
  multihost.initialize(True)
  assert calls == [
      dict(coordinator_address="127.0.0.1:1", num_processes=2, process_id=1,
           heartbeat_timeout_seconds=7),
      dict(heartbeat_timeout_seconds=multihost.HEARTBEAT_S),
  ]  # fmt: skip
  assert multihost.HEARTBEAT_S == 100  # JAX's own default, kept


def test_process_zero_keeps_followers_posted_while_it_waits():
  ops = []

  class Learner:
    announce = staticmethod(lambda op, arg, payload: ops.append(op))

  class Link:

    def join(self, versions, generations):
      ops.append("join")

    def poll(self, wait_s):
      ops.append("poll")
      return []

  lrn = Learner()
  keep = multihost.KeepFollowers(Link(), lrn, every_s=0.05)
  keep.poll(0.0)  # just announced (at construction): no NOOP
  time.sleep(0.06)
  keep.poll(0.0)
  keep.join((0,), ())  # the NOOP just sent counts as an announcement
  lrn.announce(multihost.RUN, 0, b"")  # operations go through the timing wrapper
  time.sleep(0.06)
  keep.join((0,), ())
  assert ops == ["poll", multihost.NOOP, "poll", "join", multihost.RUN, multihost.NOOP, "join"]
