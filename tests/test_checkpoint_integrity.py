"""Checkpoints carry a checksum manifest: a corrupt newest step (truncated, a flipped byte, a file
or the manifest missing) is detected on restore, logged with the reason, and the step before it is
used; a save that fails midway (an OSError such as a full disk) leaves the previous one intact and
later saves work."""

import errno
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from absl import logging as absl_logging

from diloco.inner import checkpoint, manifest
from diloco.recovery import sync_checkpoint


def _largest_file(step_dir: str) -> str:
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs if f != manifest.NAME]
  return max(files, key=os.path.getsize)


def _flip(path):
  b = bytearray(open(path, "rb").read())
  b[len(b) // 2] ^= 0x10
  open(path, "wb").write(bytes(b))


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


CORRUPTIONS = {
    "flipped byte": (lambda d: _flip(_largest_file(d)), "sha256"),
    "truncated file": (lambda d: _truncate(_largest_file(d)), "truncated"),
    "missing file": (lambda d: os.remove(_largest_file(d)), "missing"),
    "no manifest": (lambda d: os.remove(os.path.join(d, manifest.NAME)), "did not finish"),
}


def _like():
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return {"w": jax.ShapeDtypeStruct((1000,), jnp.float32, sharding=sharding)}


@pytest.fixture
def warnings(monkeypatch):
  seen = []
  monkeypatch.setattr(absl_logging, "warning", lambda msg, *a: seen.append(msg % a))
  return seen


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_newest_learner_checkpoint_falls_back(tmp_path, kind, warnings):
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=False)
  for step in (1, 2):
    assert ckpt.save(step, {"w": jnp.arange(1000.0) * step}, force=True)
  ckpt.close()
  corrupt, reason = CORRUPTIONS[kind]
  corrupt(os.path.join(tmp_path, "2"))
  reopened = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=False)
  assert reopened.latest_step() == 1
  step, state = reopened.restore(_like())
  assert step == 1
  np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(1000.0, dtype=np.float32))
  assert any("step 2" in w and reason in w for w in warnings), warnings


def test_no_intact_checkpoint_is_an_error_naming_the_directory(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1, async_save=False)
  ckpt.save(1, {"w": jnp.arange(1000.0)}, force=True)
  _flip(_largest_file(os.path.join(tmp_path, "1")))
  with pytest.raises(FileNotFoundError, match=str(tmp_path)):
    ckpt.restore(_like())


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_failing_midway_keeps_the_previous_one_and_training_goes_on(
    tmp_path, monkeypatch, async_save
):
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=async_save)
  ckpt.save(1, {"w": jnp.arange(1000.0)}, force=True)
  ckpt.wait()

  async def disk_full(self, directory, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  with monkeypatch.context() as mp:
    mp.setattr(ocp.handlers.StandardCheckpointHandler, "async_save", disk_full)
    assert not ckpt.save(2, {"w": jnp.arange(1000.0) * 2}, force=True)
    ckpt.wait()
  assert ckpt.failed_saves == 1 and ckpt.latest_step() == 1
  assert ckpt.save(3, {"w": jnp.arange(1000.0) * 3}, force=True)
  ckpt.wait()
  assert ckpt.intact_steps() == [3, 1]
  step, state = ckpt.restore(_like())
  assert step == 3 and float(state["w"][1]) == 3.0
  ckpt.close()


@pytest.mark.parametrize("kind", ["flipped byte", "truncated file"])
def test_corrupt_newest_synchronizer_checkpoint_falls_back(tmp_path, kind, warnings):
  state = lambda v: {"arrays": {"g": np.full(512, v, np.float32)}, "meta": {"versions": [int(v)]}}
  ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=3)
  assert ckpt.save(1, state(1)) and ckpt.save(2, state(2))
  ckpt.close()
  corrupt, reason = CORRUPTIONS[kind]
  corrupt(os.path.join(tmp_path, "2"))
  reopened = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=3)
  assert reopened.latest_step() == 1
  got = reopened.restore(state(0))
  assert got["meta"] == {"versions": [1]} and float(got["arrays"]["g"][0]) == 1.0
  assert any("checkpoint 2" in w and reason in w for w in warnings), warnings
