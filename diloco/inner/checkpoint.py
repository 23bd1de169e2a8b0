"""Orbax checkpoints of a learner: train state plus the grain data iterator, saved together."""

import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp


def abstract_like(tree, shardings) -> Any:
  """ShapeDtypeStructs carrying the target shardings, to restore straight onto the mesh."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


class Checkpointer:
  """Saves every `every` steps (asynchronously) and restores the newest step."""

  def __init__(self, directory: str, every: int, keep: int = 2, async_save: bool = True):
    self.every = every
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        save_interval_steps=max(every, 1),
        enable_async_checkpointing=async_save,
        create=True,
    )
    self._manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, data_iter: Any | None = None, force: bool = False) -> bool:
    """Queues a save of `state` (and the iterator position) if `step` is due or `force`."""
    items = {"state": ocp.args.StandardSave(state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    return self._manager.save(step, args=ocp.args.Composite(**items), force=force)

  def restore(
      self, abstract_state: Any, data_iter: Any | None = None, step: int | None = None
  ) -> tuple[int, Any]:
    """Restores `step` (default: newest) into the abstract state's shapes and shardings."""
    step = self._manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError("no checkpoint to restore")
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    return step, restored["state"]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
