"""A learner process's checkpoints are written in the background (issue 54): the save copies the
state off the devices and returns, the next steps run while orbax writes it; a stop finishes the
save in flight and saves the step it stopped at; a process killed during a save leaves the last
complete one to restore. Orbax's commit is held at a gate the test opens, so "in the background" is
an order of events, not a time."""

import asyncio
import os
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
from orbax.checkpoint._src.path import atomicity
from proc_helpers import wait_for

from configs import shakespeare
from diloco.config import build
from diloco.inner import checkpoint
from diloco.recovery.learner_checkpoint import LearnerCheckpointer

GATE_S = 120.0  # the longest a commit waits for its gate (a save that blocks would wait it out)


def _gated_commits(monkeypatch) -> tuple[threading.Event, list[bool]]:
  """Orbax's commit of a step's save (its rename into place) waits until the test opens the gate;
  for each commit, whether it was let through (False: it waited out GATE_S)."""
  gate, opened, finalize = threading.Event(), [], atomicity.AtomicRenameTemporaryPath.finalize

  async def gated(self, *args, **kwargs):
    if self.get().name.split(".")[0].isdigit():  # a step's directory (not one of its items)
      opened.append(await asyncio.to_thread(gate.wait, GATE_S))
    return await finalize(self, *args, **kwargs)

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", gated)
  return gate, opened


def _learner():
  parts = build.local_learners(shakespeare.get_config("runlocal,mode=decoupled"))
  return parts, parts.make_learner(0, holds_start=True), parts.islands[0].data.train_iter


def _committed(directory, step: int) -> bool:
  return os.path.isdir(os.path.join(directory, str(step)))


def test_a_learner_trains_on_while_its_save_is_written(tmp_path, monkeypatch):
  parts, learner, batches = _learner()
  ckpt = LearnerCheckpointer(str(tmp_path), every=2, async_save=True)
  for _ in range(2):
    learner.step(next(batches))
  at_save = jax.device_get(learner.state.params)
  gate, opened = _gated_commits(monkeypatch)
  assert ckpt.maybe_save(learner, batches)
  learner.step(next(batches))  # (donates the state the save was given)
  jax.block_until_ready(learner.state)
  assert not _committed(tmp_path, 2), "the save was committed before the next step ran"
  gate.set()
  ckpt.wait()
  # The save returned, and the next step ran, while its commit waited at the gate: a save that
  # blocked the learner would have waited out GATE_S inside maybe_save and found the gate shut.
  assert _committed(tmp_path, 2) and opened == [True]
  # What was written is the state at the save, not the one the step after it made.
  again = parts.make_learner(0)
  assert ckpt.restore_into(again, batches) == 2 and again.steps == 2
  same = jax.tree.map(np.array_equal, at_save, jax.device_get(again.state.params))
  assert all(jax.tree.leaves(same))
  ckpt.close()


def test_a_stop_during_a_save_finishes_it_and_saves_the_step_it_stopped_at(tmp_path, monkeypatch):
  """What learner_main does on SIGTERM (`save_now`) while a scheduled save is being written."""
  parts, learner, batches = _learner()
  ckpt = LearnerCheckpointer(str(tmp_path), every=2, async_save=True)
  for _ in range(2):
    learner.step(next(batches))
  gate, opened = _gated_commits(monkeypatch)
  assert ckpt.maybe_save(learner, batches)
  learner.step(next(batches))
  assert not _committed(tmp_path, 2)  # (held at the gate)
  gate.set()
  assert ckpt.save_now(learner, batches)  # the save in flight, then step 3
  assert _committed(tmp_path, 2) and _committed(tmp_path, 3) and opened == [True, True]
  ckpt.close()
  restarted = LearnerCheckpointer(str(tmp_path), every=2, async_save=True)
  again = parts.make_learner(0)
  assert restarted.restore_into(again, batches) == 3 and again.steps == 3
  restarted.close()


CHILD = """
import sys, time
import jax.numpy as jnp
from diloco.inner import checkpoint
ckpt = checkpoint.Checkpointer(sys.argv[1], 1, async_save=True)
ckpt.save(1, {"w": jnp.full((1000,), 1.0)}, force=True)
ckpt.wait()
import asyncio
from orbax.checkpoint._src.path import atomicity
async def never(self, *args, **kwargs):
  await asyncio.sleep(3600)
atomicity.AtomicRenameTemporaryPath.finalize = never
ckpt.save(2, {"w": jnp.full((1000,), 2.0)}, force=True)
print("saving", flush=True)
time.sleep(3600)
"""


def test_a_process_killed_during_a_save_leaves_the_last_complete_one(tmp_path):
  directory = str(tmp_path / "ckpt")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
  child = subprocess.Popen(
      [sys.executable, "-c", CHILD, directory], stdout=subprocess.PIPE, text=True, env=env
  )
  try:
    assert child.stdout.readline().strip() == "saving"
    tmp = os.path.join(directory, "2" + checkpoint.TMP_SUFFIX)
    wait_for(lambda: os.path.isdir(tmp), 30, "the save of step 2 never started")
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait(30)
  ckpt = checkpoint.Checkpointer(directory, 1, async_save=True)
  assert ckpt.latest_step() == 1
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  like = {"w": jax.ShapeDtypeStruct((1000,), jnp.float32, sharding=sharding)}
  step, state = ckpt.restore(like)
  assert step == 1 and float(state["w"][0]) == 1.0
  assert ckpt.save(2, {"w": jnp.full((1000,), 3.0)}, force=True)  # (over the leftover)
  ckpt.wait()
  assert ckpt.intact_steps() == [2, 1]
  ckpt.close()
