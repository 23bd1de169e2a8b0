"""Orbax checkpoints of the synchronizer's durable state (`Synchronizer.state_dict()`).

Each save is named by the number of merges so far. Orbax writes a save into
`<merges>.orbax-checkpoint-tmp` and renames it to `<merges>` only once every item is written, so a
crash in the middle of a save leaves the previous checkpoint as the newest (orbax ignores the
unfinished directory, and replaces it if that step is saved again). `save(..., interrupt=True)` is
that crash, injected on purpose: it writes part of the save, then raises `SimulatedCrash`.
Each complete save gets a checksum manifest (diloco/inner/manifest.py): restores use the newest
step whose files match theirs, log why a newer one was passed over and rename that one aside.
"""

import dataclasses
from typing import Any

import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from diloco import paths
from diloco.inner import manifest


class SimulatedCrash(RuntimeError):
  """The synchronizer died here (injected by a fault schedule or a test)."""


class _CrashingJsonHandler(ocp.handlers.JsonCheckpointHandler):
  """Writes half of its JSON file, then dies."""

  async def _save_fn(self, x, directory):
    text = str(x)
    (epath.Path(directory) / "partial").write_text(text[: len(text) // 2])
    raise SimulatedCrash("synchronizer crashed while writing a checkpoint")


@ocp.args.register_with_handler(_CrashingJsonHandler, for_save=True)
@dataclasses.dataclass
class _CrashingSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(_CrashingJsonHandler, for_restore=True)
@dataclasses.dataclass
class _CrashingRestore(ocp.args.CheckpointArgs):
  """Never used: orbax wants a restore argument type for every handler."""


class SyncCheckpointer:
  """Saves `state_dict()`s synchronously and restores the newest one."""

  def __init__(self, directory: str, keep: int = 2):
    self.directory, self.keep = paths.absolute(directory), keep
    self._verified: dict = {}  # manifest.intact_steps's verdicts
    self._open()

  def _open(self) -> None:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=self.keep, create=True, enable_async_checkpointing=False
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def intact_steps(self) -> list[int]:
    """Steps whose files match their checksum manifest, newest first (the others are logged and
    set aside as `<merges>.corrupt-<n>`, so that those merges can be saved again)."""
    steps = self._manager.all_steps()
    for step in steps:  # committed by orbax, killed before its manifest: whole, sealed now
      manifest.seal_committed(paths.join(self.directory, str(step)))
    intact = manifest.intact_steps(self.directory, steps, self._verified, move=True)
    if len(intact) < len(steps):
      self._manager.reload()  # orbax caches its step list: forget the steps set aside
    return intact

  def latest_step(self) -> int | None:
    steps = self.intact_steps()
    return steps[0] if steps else None

  def save(self, merges: int, state: dict[str, Any], interrupt: bool = False) -> bool:
    """Saves `state` as step `merges` (skipped if that step exists); see the module doc.

    A save that fails with an OSError (a full disk) is logged and returns False; the previous
    checkpoint stays the newest intact one.
    """
    if merges in self._manager.all_steps():
      return False
    items = {
        "arrays": ocp.args.StandardSave(state["arrays"]),
        "meta": ocp.args.JsonSave(state["meta"]),
    }
    if not interrupt:
      try:
        saved = self._manager.save(merges, args=ocp.args.Composite(**items), force=True)
      except OSError as e:
        logging.error("synchronizer checkpoint %d in %s failed (%s)", merges, self.directory, e)
        return False
      if saved:
        manifest.write(paths.join(self.directory, str(merges)))
      return saved
    items["crash"] = _CrashingSave({"merges": merges})
    absl_logger = logging.get_absl_logger()
    level = absl_logger.level
    absl_logger.setLevel("CRITICAL")  # orbax logs the injected exception as an error
    try:
      return self._manager.save(merges, args=ocp.args.Composite(**items), force=True)
    finally:
      absl_logger.setLevel(level)

  def restore(self, like: dict[str, Any], step: int | None = None) -> dict[str, Any]:
    """The newest intact (or `step`'s) state, with the array shapes of `like` (a `state_dict()`)."""
    if step is None:
      intact = self.intact_steps()
      if not intact:
        raise FileNotFoundError(f"no intact synchronizer checkpoint in {self.directory}")
      step = intact[0]
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
            arrays=ocp.args.StandardRestore(like["arrays"]), meta=ocp.args.JsonRestore()
        ),
    )
    return {"arrays": dict(restored["arrays"]), "meta": restored["meta"]}

  def reopen(self) -> None:
    """Forgets the open manager, as a restarted process would, and reads the directory anew."""
    self._manager.close()
    self._open()

  def close(self) -> None:
    self._manager.close()
