"""Checkpoints carry a checksum manifest: a corrupt newest step (truncated, a flipped byte, a file
missing) is detected on restore, logged with the reason, and the step before it is
used, and the corrupt one is renamed aside so that the run can save that step again; a save that
fails midway (an OSError such as a full disk) leaves the previous one intact and later saves work.
"""

import asyncio
import errno
import glob
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import checkpoint as orbax_metadata
import proc_helpers
import pytest
from absl import logging as absl_logging

from configs import shakespeare
from diloco import metrics, train
from diloco.inner import checkpoint, island as island_lib, manifest
from diloco.outer import fragments
from diloco.recovery import sync_checkpoint
from diloco.runtime import preemption

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
}


def _like():
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return {"w": jax.ShapeDtypeStruct((1000,), jnp.float32, sharding=sharding)}


def test_a_state_saved_from_host_copies_restores_to_its_bits_and_shardings(tmp_path):
  """Checkpointer saves NumPy copies of the arrays this process holds whole (`_on_host`); a restore
  onto the target's shardings gives jax.Arrays with those shardings and the saved bits: one split
  over the 8 devices, one replicated on them, a scalar step."""
  mesh = jax.make_mesh((8,), ("data",))
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  values = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
  state = {
      "split": jax.device_put(values, split),
      "whole": jax.device_put(values[:2], whole),
      "step": jax.device_put(np.int32(7), whole),
  }
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(checkpoint._on_host(state)))
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1)
  assert ckpt.save(7, state)
  shardings = jax.tree.map(lambda x: x.sharding, state)
  step, back = ckpt.restore(checkpoint.abstract_like(state, shardings))
  ckpt.close()
  assert step == 7
  for k in state:
    assert isinstance(back[k], jax.Array) and back[k].sharding == state[k].sharding, k
    assert back[k].dtype == state[k].dtype, k
    np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(state[k]))


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


@pytest.mark.parametrize("which", ["learner", "synchronizer"])
def test_a_step_committed_without_its_manifest_is_whole_and_sealed(tmp_path, which, warnings):
  """A kill between orbax's commit and the manifest (issue 49, point 1): the newest step is used,
  not set aside, and its manifest is written when the directory is opened again."""
  if which == "learner":
    ckpt = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=False)
    for step in (1, 2):
      assert ckpt.save(step, {"w": jnp.arange(1000.0) * step}, force=True)
  else:
    ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=3)
    for step in (1, 2):
      assert ckpt.save(step, {"arrays": {"w": np.arange(1000.0) * step}, "meta": {"v": step}})
  ckpt.close()
  os.remove(os.path.join(tmp_path, "2", manifest.NAME))
  if which == "learner":
    reopened = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=False)
    assert reopened.latest_step() == 2
    step, state = reopened.restore(_like())
    assert step == 2 and float(state["w"][1]) == 2.0
  else:
    reopened = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=3)
    assert reopened.latest_step() == 2
  assert manifest.exists(os.path.join(tmp_path, "2"))
  assert not [n for n in os.listdir(tmp_path) if ".corrupt-" in n]
  assert any("committed by orbax" in w and "not written" in w for w in warnings), warnings


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

  # Orbax writes the step's metadata on a thread of its own; slowed down, that write runs after
  # the failure, which is the order that once failed the next save in CI (the temporary directory
  # removed under it, its error raised by save 3).
  impl = orbax_metadata._MetadataStoreImpl  # pylint: disable=protected-access
  write = impl.write

  def late_write(self, *args, **kwargs):
    time.sleep(0.3)
    return write(self, *args, **kwargs)

  with monkeypatch.context() as mp:
    mp.setattr(ocp.handlers.StandardCheckpointHandler, "async_save", disk_full)
    mp.setattr(impl, "write", late_write)
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


def _set_aside(tmp_path, step: int) -> list[str]:
  return sorted(n for n in os.listdir(tmp_path) if n.startswith(f"{step}.corrupt-"))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupt_step_is_set_aside_and_the_run_saves_that_step_again(
    tmp_path, kind, async_save, warnings
):
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=async_save)
  for step in (1, 2):
    assert ckpt.save(step, {"w": jnp.arange(1000.0) * step}, force=True)
  ckpt.close()
  corrupt, reason = CORRUPTIONS[kind]
  corrupt(os.path.join(tmp_path, "2"))
  reopened = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=async_save)
  assert reopened.restore(_like())[0] == 1
  assert _set_aside(tmp_path, 2) == ["2.corrupt-1"] and not os.path.exists(tmp_path / "2")
  assert manifest.problem(str(tmp_path / "2.corrupt-1"))  # kept as it was, for inspection
  assert any("step 2" in w and reason in w and "2.corrupt-1" in w for w in warnings), warnings
  # Retrained, step 2 is saved again: due (before: orbax skipped it, as not newer than its corrupt
  # step 2) and forced (before: StepAlreadyExistsError).
  assert reopened.save(2, {"w": jnp.arange(1000.0) * 20})
  assert reopened.save(3, {"w": jnp.arange(1000.0) * 30}, force=True)
  reopened.wait()
  assert reopened.intact_steps() == [3, 2, 1]
  step, state = reopened.restore(_like(), step=2)
  assert float(state["w"][1]) == 20.0
  reopened.close()


def test_a_step_corrupt_twice_is_set_aside_under_the_next_free_name(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=False)
  ckpt.save(1, {"w": jnp.arange(1000.0)}, force=True)
  for _ in range(2):
    ckpt.save(2, {"w": jnp.arange(1000.0) * 2}, force=True)
    _flip(_largest_file(os.path.join(tmp_path, "2")))
    assert ckpt.latest_step() == 1
  ckpt.close()
  assert _set_aside(tmp_path, 2) == ["2.corrupt-1", "2.corrupt-2"]
  reopened = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=False)
  assert reopened.intact_steps() == [1]  # orbax lists no `<step>.corrupt-<n>` as a step
  reopened.close()


def test_a_reader_of_another_runs_checkpoints_leaves_a_corrupt_step_in_place(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1, keep=3, async_save=False)
  for step in (1, 2):
    ckpt.save(step, {"w": jnp.arange(1000.0) * step}, force=True)
  ckpt.close()
  _flip(_largest_file(os.path.join(tmp_path, "2")))
  reader = checkpoint.Checkpointer(str(tmp_path), 1, async_save=False, set_aside=False)
  assert reader.restore(_like())[0] == 1
  reader.close()
  assert sorted(os.listdir(tmp_path)) == ["1", "2"]


def test_a_corrupt_synchronizer_step_is_set_aside_and_saved_again(tmp_path, warnings):
  state = lambda v: {"arrays": {"g": np.full(512, v, np.float32)}, "meta": {"versions": [int(v)]}}
  ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=3)
  assert ckpt.save(1, state(1)) and ckpt.save(2, state(2))
  ckpt.close()
  _flip(_largest_file(os.path.join(tmp_path, "2")))
  reopened = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=3)
  assert reopened.restore(state(0))["meta"] == {"versions": [1]}
  assert _set_aside(tmp_path, 2) == ["2.corrupt-1"]
  assert reopened.save(2, state(20))  # before: skipped as existing, so merge 2 had no checkpoint
  assert reopened.intact_steps() == [2, 1]
  assert reopened.restore(state(0))["meta"] == {"versions": [20]}
  reopened.close()


STEP_METADATA = orbax_metadata.step_metadata_file_path("x").name  # orbax's, written at its commit


@pytest.mark.parametrize("left", [[], [STEP_METADATA]], ids=["empty", "metadata"])
def test_a_synchronizer_killed_while_removing_its_oldest_step_restores_the_newest(
    tmp_path, left, warnings
):
  """A SIGKILL while orbax removed the oldest step (`keep`) left its directory with some of its
  files, which a restarted synchronizer sealed as committed (no save in progress) and then failed
  to read in every restore (KeyError: 'Item "meta" was not found in the checkpoint', in a full
  run of test_grpc.py's synchronizer kill). It is set aside; the newest step restores."""
  state = lambda v: {"arrays": {"g": np.full(512, v, np.float32)}, "meta": {"versions": [int(v)]}}
  ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=2)
  assert ckpt.save(1, state(1)) and ckpt.save(2, state(2))
  ckpt.close()
  oldest = tmp_path / "1"
  for name in os.listdir(oldest):  # the items and the manifest removed, `left` not yet
    if name not in left:
      path = oldest / name
      shutil.rmtree(path) if path.is_dir() else path.unlink()
  reopened = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=2)
  got = reopened.restore(state(0))
  assert got["meta"] == {"versions": [2]} and float(got["arrays"]["g"][0]) == 2.0
  assert _set_aside(tmp_path, 1) == ["1.corrupt-1"] and reopened.intact_steps() == [2]
  assert any("checkpoint 1" in w and "does not read" in w for w in warnings), warnings
  assert reopened.save(3, state(3)) and reopened.intact_steps() == [3, 2]
  reopened.close()


def test_a_dp_run_whose_final_checkpoint_is_corrupt_retrains_it_and_finishes(tmp_path):
  config = shakespeare.get_config("runlocal")  # 40 steps
  config.checkpoint_every = 10
  workdir = str(tmp_path / "run")
  first = train.train_and_evaluate(config, workdir)
  checkpoints = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(checkpoints)) == ["30", "40"]
  _flip(_largest_file(os.path.join(checkpoints, "40")))

  # Before: restored 30, retrained, and died saving 40 again (orbax's StepAlreadyExistsError).
  rest = train.train_and_evaluate(config, workdir)
  assert rest["resumed_from_step"] == 30 and rest["finished"]
  assert sorted(os.listdir(checkpoints)) == ["30", "40", "40.corrupt-1"]
  assert manifest.problem(os.path.join(checkpoints, "40.corrupt-1"))  # kept as it was
  ckpt = checkpoint.Checkpointer(checkpoints, config.checkpoint_every)
  assert ckpt.intact_steps() == [40, 30]
  step, state = ckpt.restore(island_lib.build_island(config, jax.devices()).abstract_state())
  ckpt.close()
  assert step == 40
  saved = metrics.params_sha256(fragments.flatten(jax.device_get(state.params)))
  assert saved == rest["params_sha256"] == first["params_sha256"]  # as if never corrupted


# ---- a full disk (issue 49, point 4) ----


@pytest.fixture
def small_disk(tmp_path):
  """A real 1.125 MiB filesystem (tmpfs; needs root): the first tiny checkpoint fits (0.4 MiB, and
  the run's 0.25 MiB summary reserve), not a second beside it (1.25x the first must be free)."""
  mount = tmp_path / "disk"
  mount.mkdir()
  done = subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=1152k", "tmpfs", str(mount)], check=False
  )
  if done.returncode:
    pytest.skip("cannot mount a tmpfs here (not root?); the raising test below covers the code")
  yield mount
  subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_one_line_per_save_and_the_run_finishes_with_its_summary(small_disk):
  """Before: tensorstore's ValueError (RESOURCE_EXHAUSTED ... No space left on device) was no
  OSError: rc 1, about 560 lines of traceback, a temporary directory left on the full disk. Then
  the summary did not fit in 1 of 8 runs (orbax's steps took 0.52-0.92 MiB of the 1 MiB disk):
  the run now holds a reserve for it (train.RESERVE_BYTES), removed when it is written."""
  workdir = small_disk / "run"
  out = proc_helpers.train(workdir, "--config.steps=40", "--config.checkpoint_every=5")
  assert out.returncode == preemption.EXIT_SAVE_FAILED == 74, out.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["finished"] and summary["final_checkpoint_failed"]
  assert summary["checkpoint_failures"] >= 1
  failed = [l for l in out.stderr.splitlines() if "checkpoint save of step" in l]
  assert len(failed) == summary["checkpoint_failures"] and "No space left" in failed[-1]
  assert "Traceback" not in out.stderr
  assert not glob.glob(str(workdir / "checkpoints" / "*orbax-checkpoint-tmp*"))
  assert not (workdir / train.RESERVE_FILE).exists()


def test_whatever_the_storage_layer_raises_is_one_line_and_its_temporary_is_removed(
    tmp_path, monkeypatch
):
  """The exception tensorstore raised on the full tmpfs above, raised by a stand-in for orbax's
  save after it made its temporary directory: the save fails cleanly, the next one works."""
  ckpt = checkpoint.Checkpointer(str(tmp_path), 1, async_save=False)
  assert ckpt.save(1, {"w": jnp.arange(1000.0)}, force=True)
  real = ckpt._manager.save

  def full_disk(step, **kwargs):
    os.makedirs(tmp_path / f"{step}.orbax-checkpoint-tmp-1" / "state")
    raise ValueError(
        'RESOURCE_EXHAUSTED: Error writing "params/0" in OCDBT database: Failed to write 38997 '
        "bytes to file 18: No space left on device [os_error_code='28']\nsecond line"
    )

  errors = []
  monkeypatch.setattr(checkpoint.logging, "error", lambda msg, *a: errors.append(msg % a))
  monkeypatch.setattr(ckpt._manager, "save", full_disk)
  assert not ckpt.save(2, {"w": jnp.arange(1000.0) * 2}, force=True)
  assert ckpt.failed_steps == [2] and len(errors) == 1 and "second line" not in errors[0]
  assert "ValueError: RESOURCE_EXHAUSTED" in errors[0] and "training goes on" in errors[0]
  assert not glob.glob(str(tmp_path / "*orbax-checkpoint-tmp*"))
  monkeypatch.setattr(ckpt._manager, "save", real)
  assert ckpt.save(3, {"w": jnp.arange(1000.0) * 3}, force=True)
  assert ckpt.latest_step() == 3
  ckpt.close()


def test_orbax_tracebacks_of_a_failed_save_are_cut_to_one_line():
  """Orbax logs a failed background save with the storage library's whole traceback (its
  finalize thread, before the error reaches us): the record keeps one line and the reason."""
  try:
    raise ValueError("RESOURCE_EXHAUSTED: Failed writing\nsecond line")
  except ValueError:
    exc_info = sys.exc_info()
  record = logging.getLogger("absl").makeRecord(
      "absl",
      40,
      "/x/orbax/checkpoint/checkpoint_manager.py",
      2107,
      "step=%s failed.",
      (5,),
      exc_info,
  )
  [orbax_filter] = [f for f in logging.getLogger("absl").filters if "Orbax" in type(f).__name__]
  assert orbax_filter.filter(record)
  assert logging.Formatter().format(record) == (
      "step=5 failed. (ValueError: RESOURCE_EXHAUSTED: Failed writing)"
  )
  ours = logging.getLogger("absl").makeRecord("absl", 40, "/x/elsewhere/a.py", 1, "m", (), exc_info)
  assert orbax_filter.filter(ours) and ours.exc_info is exc_info  # other tracebacks stay


def test_reads_and_writes_that_end_after_orbax_closed_their_loop_are_quiet(capsys, monkeypatch):
  """Tensorstore's reads and writes of a failed save or restore still in flight call orbax's
  closed event loop from their own threads: their RuntimeError is a debug line (the failure
  itself was reported once), other errors print as before."""
  loop = asyncio.new_event_loop()
  loop.close()
  lines = []
  monkeypatch.setattr(checkpoint.logging, "debug", lambda msg, *a: lines.append(msg % a))
  for error in (None, ValueError("something else")):
    try:
      if error:
        raise error
      loop.call_soon_threadsafe(print)
    except (RuntimeError, ValueError):
      sys.excepthook(*sys.exc_info())
  assert lines == ["a read or write of a failed checkpoint operation ended: Event loop is closed"]
  err = capsys.readouterr().err
  assert err.count("Traceback") == 1 and "ValueError: something else" in err
