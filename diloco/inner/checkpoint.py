"""Orbax checkpoints of a learner: train state plus the grain data iterator, saved together.

Each complete save gets a checksum manifest (diloco/inner/manifest.py), written as soon as orbax
has committed it (its post-finalization callback); a step that orbax committed but whose manifest
was never written (the process was killed in between) is whole by orbax's commit, and gets its
manifest when the directory is next opened. Restores take the newest
step whose files match it: a truncated or altered newest step is logged with the reason and the one
before it is used. The failed step is renamed aside (`<step>.corrupt-<n>`, kept for inspection) so
that training can save that step again; a reader of another run's directory (`set_aside=False`, as
warm starts) leaves it in place. A save that fails, now or in the background, with whatever the
storage library raises (an OSError; tensorstore's ValueError "RESOURCE_EXHAUSTED ... No space left
on device" for a full disk) is one logged line, its temporary directory is removed and training
goes on; orbax writes into a temporary directory, so the previous checkpoint stays as it was. In a
multi-process job (one island over several processes) a failed save stops the job instead
(`SaveFailed`): the processes save together, and one that went on would wait for the others in
its next collective while they wait for it in orbax's barrier.
A checkpoint of a model whose blocks were stored the other way (`model.scan_layers`) is converted
on restore (models/layer_stack.py).
"""

import logging as pylogging
import os
import sys
import threading
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from diloco import paths
from diloco.inner import manifest
from diloco.models import layer_stack

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's directory of a save in progress


class _OrbaxErrorsInOneLine(pylogging.Filter):
  """Orbax's own log records of a failed background save, cut to one line each.

  Orbax logs the storage library's whole traceback from its commit and finalize threads (about
  560 lines for a full disk) before the save's error reaches `Checkpointer`, which logs the
  failure once in its own words; the error's first line is kept on orbax's record."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    if record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname:
      error = record.exc_info[1]
      first = (str(error).strip().splitlines() or [""])[0][:300]
      record.msg = f"{record.getMessage()} ({type(error).__name__}: {first})"
      record.args, record.exc_info, record.exc_text = None, None, None
    return True


logging.get_absl_logger().addFilter(_OrbaxErrorsInOneLine())


def _late(error: BaseException | None, where: object = None) -> bool:
  """The error of a read or write of a failed save or restore, ended after the failure.

  Orbax runs a save's writes (a restore's reads) on an asyncio loop of its own and closes it at
  the first error; tensorstore's operations still in flight then call the closed loop from their
  own threads and print the RuntimeError's traceback (PyErr_Print, or as unraisable), and the
  coroutines of the other reads are collected unfinished at exit, printing theirs."""
  if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
    return True
  code = getattr(where, "cr_code", None)  # an orbax coroutine collected unfinished
  return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _quiet_late_errors(previous_excepthook, previous_unraisablehook):
  """Hooks that log `_late` errors as a debug line (the save's failure is our one line, the
  restore's is raised); any other error goes to the hooks that were there before."""

  def note(error):
    try:
      logging.debug("a read or write of a failed checkpoint operation ended: %s", error)
    except Exception:  # pylint: disable=broad-except  (at exit, logging may be gone)
      pass

  def excepthook(kind, error, tb):
    if _late(error):
      note(error)
    else:
      previous_excepthook(kind, error, tb)

  def unraisablehook(unraisable):
    if _late(unraisable.exc_value, unraisable.object):
      note(unraisable.exc_value)
    else:
      previous_unraisablehook(unraisable)

  return excepthook, unraisablehook


sys.excepthook, sys.unraisablehook = _quiet_late_errors(sys.excepthook, sys.unraisablehook)


def _write_manifest(step_dir: str) -> None:
  """The manifest of a committed step; a full disk is one line (the step stays whole by orbax's
  commit, and gets its manifest when the directory is opened with room for it)."""
  try:
    manifest.write(step_dir)
  except Exception as e:  # pylint: disable=broad-except  (a full disk; a bucket's HttpError)
    logging.error("could not write the checksum manifest of %s (%s)", step_dir, e)


def abstract_like(tree, shardings) -> Any:
  """ShapeDtypeStructs carrying the target shardings, to restore straight onto the mesh."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


def _on_host(state: Any) -> Any:
  """The state's arrays that this process holds whole, copied to NumPy arrays: orbax saves those in
  a quarter of the CPU time of the same jax.Arrays, whose replicas it slices op by op (the tiny
  model's train state on 8 CPU devices: 111 ms a save against 423 ms), and restores them onto the
  target's shardings all the same, to the same bits (tests/test_checkpoint_integrity.py). Arrays
  split over processes stay jax.Arrays: each process writes its own shards."""
  whole = lambda x: isinstance(x, jax.Array) and x.is_fully_addressable
  return jax.tree.map(lambda x: np.array(x) if whole(x) else x, state)


class SaveFailed(OSError):
  """A save of a checkpoint of a multi-process job failed: its processes save together (orbax's
  barriers), so one that goes on alone would wait for the others forever; the job stops."""


class Checkpointer:
  """Saves every `every` steps (asynchronously) and restores the newest intact step."""

  def __init__(
      self,
      directory: str,
      every: int,
      keep: int = 2,
      async_save: bool = True,
      set_aside: bool = True,
  ):
    self.every, self.directory, self.async_save = every, paths.absolute(directory), async_save
    self.set_aside = set_aside
    self._seals = jax.process_index() == 0 or not set_aside  # writes the manifests of its saves
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        save_interval_steps=max(every, 1),
        enable_async_checkpointing=async_save,
        create=True,
        # the manifest as soon as orbax has committed a save, not at the next save or close
        # (synchronous saves are sealed in `save` itself)
        async_options=(
            ocp.AsyncOptions(post_finalization_callback=self._seal_committed)
            if async_save
            else None
        ),
    )
    self._lock = threading.Lock()  # _unsealed: orbax's finalize thread and this one
    self._unsealed: list[int] = []  # saved (or being saved) without a manifest yet
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._verified: dict = {}  # manifest.intact_steps's verdicts, so a restore re-reads nothing
    self.failed_saves = 0
    self.failed_steps: list[int] = []  # the steps whose save failed, in order

  def step_dir(self, step: int) -> str:
    return paths.join(self.directory, str(step))

  @property
  def _job_shared(self) -> bool:
    """The run's own directory, written by every process of a multi-process job: process 0
    alone writes and checks its manifests (the others read none of its bytes for them)."""
    return self.set_aside and jax.process_count() > 1

  def intact_steps(self) -> list[int]:
    """Steps whose files match their manifest, newest first (the others are logged and set aside).

    Waits for queued saves first: a step still being saved has no manifest yet. In a directory
    of a multi-process job process 0 checks and the others take its newest intact step (a
    broadcast: every process calls this at the same point, as they restore together).
    """
    self._seal()
    if not self._job_shared:
      return self._checked_steps()
    from jax.experimental import multihost_utils

    newest = (self._checked_steps() or [-1])[0] if jax.process_index() == 0 else -1
    step = int(multihost_utils.broadcast_one_to_all(np.int64(newest)))
    return [step] if step >= 0 else []

  def _checked_steps(self) -> list[int]:
    steps = self._manager.all_steps()
    if self.set_aside:  # the owner of the directory: committed steps get their manifest now
      for step in steps:
        manifest.seal_committed(self.step_dir(step))
    intact = manifest.intact_steps(self.directory, steps, self._verified, move=self.set_aside)
    if self.set_aside and len(intact) < len(steps):
      self._manager.reload()  # orbax caches its step list: forget the steps set aside
    return intact

  def latest_step(self) -> int | None:
    steps = self.intact_steps()
    return steps[0] if steps else None

  def save(self, step: int, state: Any, data_iter: Any | None = None, force: bool = False) -> bool:
    """Queues a save of `state` (and the iterator position) if `step` is due or `force`.

    False when not due or when the save failed (logged; the previous checkpoint is intact).
    """
    self._seal()
    if not (force or self._manager.should_save(step)):
      return False
    short = self._short_of_space(state)
    if short:
      return self._failed(step, OSError(short))
    items = {"state": ocp.args.StandardSave(_on_host(state))}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    try:
      saved = self._save_once(step, items, force)
    except Exception as e:  # pylint: disable=broad-except  (tensorstore: ValueError, orbax: ...)
      self._drain()
      return self._failed(step, e)
    if saved:
      with self._lock:
        self._unsealed.append(step)
      if not self.async_save:
        self._seal()
    return saved

  def _save_once(self, step: int, items: dict, force: bool) -> bool:
    """Orbax's save, tried again once when it raises the leftover of a save that failed.

    Orbax may still write a failed save's metadata into its temporary directory after the save
    raised, on a thread of its own; `_failed` has removed that directory by then, and the write's
    error is raised by the next save, which has done nothing yet."""
    args = ocp.args.Composite(**items)
    try:
      return self._manager.save(step, args=args, force=force)
    except OSError as e:
      leftover = [paths.join(self.directory, f"{s}{TMP_SUFFIX}") for s in self.failed_steps]
      if not any(path in str(e) for path in leftover):
        raise
      logging.info("the failed save's leftover error (%s) put aside; saving step %d", e, step)
      self._drain()
      return self._manager.save(step, args=args, force=force)

  def _short_of_space(self, state: Any) -> str:
    """Why the disk cannot hold another save ('' when it can): less free space than 1.25x the
    largest committed step, or with none yet 2x the state's bytes (orbax's files took 1.15x of
    them from host copies; 1.70x from jax.Arrays on eight devices). Checked first, so that a full
    disk is one line rather than the storage library's errors from every thread it writes with."""
    free = paths.free_bytes(self.directory)
    if free == float("inf"):  # a bucket
      return ""
    steps = [s for s in self._manager.all_steps() if paths.isdir(self.step_dir(s))]
    if steps:
      need = 1.25 * max(paths.tree_bytes(self.step_dir(s)) for s in steps)
    else:
      need = 2.0 * sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(state))
    if free >= need:
      return ""
    return f"No space left for it: {free / 2**20:.1f} MiB free, about {need / 2**20:.1f} MiB needed"

  def _failed(self, step: int, error: Exception) -> bool:
    """One line for a save that failed (whatever the storage library raised: OSError, or
    tensorstore's ValueError for a full disk), its temporary directory removed."""
    self.failed_saves += 1
    self.failed_steps.append(step)
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    logging.error(
        "checkpoint save of step %d in %s failed (%s: %s); training goes on",
        step,
        self.directory,
        type(error).__name__,
        first[:300],
    )
    for path in paths.glob(paths.join(self.directory, f"*{TMP_SUFFIX}*")):
      paths.rmtree(path)
    if self._job_shared:
      raise SaveFailed(
          f"checkpoint save of step {step} in {self.directory} failed in process "
          f"{jax.process_index()} of {jax.process_count()} ({type(error).__name__}: {first[:300]})"
      )
    return False

  def _seal_committed(self) -> None:
    """Writes the manifest of each queued step that orbax has committed (its final directory
    exists); orbax calls it on its finalize thread right after a save commits."""
    with self._lock:
      pending = list(self._unsealed)
    sealed = [s for s in pending if manifest.committed(self.step_dir(s))]
    for step in sealed:
      if self._seals and not manifest.exists(self.step_dir(step)):
        _write_manifest(self.step_dir(step))
    with self._lock:
      self._unsealed = [s for s in self._unsealed if s not in sealed]

  def _drain(self) -> Exception | None:
    """Waits until orbax has nothing left running; the first error it raised, if any.

    Orbax raises one background error per wait and keeps the rest queued (a failed save's
    metadata write among them): waiting again until it returns quietly means that nothing writes
    into a temporary directory after `_failed` removes it, and no leftover error of this save
    fails the next one."""
    first = None
    for _ in range(8):
      try:
        self._manager.wait_until_finished()
        self._manager.check_for_errors()  # also waits for the metadata writes of a failed save
        return first
      except Exception as e:  # pylint: disable=broad-except  (an asynchronous save failed)
        first = first or e
    return first

  def _seal(self) -> None:
    """Waits for queued saves and writes the manifests of those that completed."""
    with self._lock:
      pending = list(self._unsealed)
    if not pending:
      return
    error = self._drain()
    if error is not None:
      self._failed(pending[-1], error)
    done = set(self._manager.all_steps())
    for step in pending:
      path = self.step_dir(step)
      if self._seals and step in done and manifest.committed(path) and not manifest.exists(path):
        _write_manifest(path)
    with self._lock:
      self._unsealed = [s for s in self._unsealed if s not in pending]

  def restore(
      self, abstract_state: Any, data_iter: Any | None = None, step: int | None = None
  ) -> tuple[int, Any]:
    """Restores `step` (default: the newest intact one) into the abstract state's shapes."""
    self._seal()
    if step is None:
      intact = self.intact_steps()
      if not intact:
        raise FileNotFoundError(f"no intact checkpoint to restore in {self.directory}")
      step = intact[0]
    try:
      return step, self._restore(step, abstract_state, data_iter)
    except (ValueError, KeyError, TypeError) as error:
      # A model's blocks in the other form (a loop's checkpoint for a scanned model, or back):
      # restored as saved, then converted. Anything else that does not fit (another model) is
      # orbax's error: that is no corruption.
      other = layer_stack.other_form(abstract_state)
      if other is None:
        raise
      try:
        saved = self._restore(step, other, data_iter)
      except (ValueError, KeyError, TypeError):
        raise error from None
    logging.info("checkpoint %d: blocks converted to this model's form (model.scan_layers)", step)
    place = lambda like, x: jax.device_put(x, like.sharding) if hasattr(like, "sharding") else x
    return step, jax.tree.map(place, abstract_state, layer_stack.other_form(saved))

  def _restore(self, step: int, abstract_state: Any, data_iter: Any | None) -> Any:
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    return self._manager.restore(step, args=ocp.args.Composite(**items))["state"]

  def wait(self) -> None:
    self._seal()

  def close(self) -> None:
    self._seal()
    self._manager.close()
