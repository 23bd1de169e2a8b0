"""Checkpoints and restarts of learners and the synchronizer, for a runtime to call.

Learner m saves into WORKDIR/checkpoints/learner<m> every `learner_every` inner steps; the
synchronizer saves into WORKDIR/checkpoints/synchronizer when it asks to (a `Checkpoint` action,
every N merges), at the start and at shutdown. A learner that comes back restores its newest
checkpoint, data iterator included; without one it starts over: fresh parameters and inner optimizer
(step 0, so its learning-rate schedule warms up again), its data shard from the beginning, and no
fragment held (versions -1), so that its Join fetches every global fragment before it trains.
A run starts with empty checkpoint directories (multi-learner runs do not resume), so that no
restart can find a checkpoint of an earlier run.
"""

from collections.abc import Callable
from typing import Any

from diloco import paths
from diloco.outer.learner.learner import Learner
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.recovery import sync_checkpoint
from diloco.recovery.learner_checkpoint import LearnerCheckpointer


class Recovery:
  """Owns the checkpoint directories of one run."""

  def __init__(
      self,
      workdir: str,
      make_learner: Callable[[int], Learner],
      data_iters: list,
      learner_every: int,
      sync_every: int,
  ):
    root = paths.join(workdir, "checkpoints")
    for name in [f"learner{m}" for m in range(len(data_iters))] + ["synchronizer"]:
      paths.rmtree(paths.join(root, name))
    self.make_learner, self.data_iters = make_learner, data_iters
    self.learner_ckpts = [
        LearnerCheckpointer(paths.join(root, f"learner{m}"), learner_every)
        for m in range(len(data_iters))
    ]
    self.sync_every = sync_every
    self.sync_ckpt = (
        sync_checkpoint.SyncCheckpointer(paths.join(root, "synchronizer")) if sync_every else None
    )
    self._initial_iters = [it.get_state() for it in data_iters]
    self.learner_saves = 0
    self.sync_saves = 0

  def after_step(self, learner: Learner) -> bool:
    """Saves the learner if its step is due; returns whether it saved."""
    saved = self.learner_ckpts[learner.index].maybe_save(learner, self.data_iters[learner.index])
    self.learner_saves += saved
    return saved

  def save_sync(self, sync: Synchronizer, force: bool = False, interrupt: bool = False) -> bool:
    """Saves the synchronizer's state (as step = merges so far); `force` is for start and
    shutdown, other saves come from its Checkpoint actions. `interrupt`: see sync_checkpoint."""
    del force  # every call saves; the name says why the caller saves
    if self.sync_ckpt is None:
      return False
    saved = self.sync_ckpt.save(sync.merges, sync.state_dict(), interrupt=interrupt)
    self.sync_saves += saved
    return saved

  def restore_learner(self, m: int) -> tuple[Learner, int | None]:
    """Learner m as it comes back: its newest checkpoint's step, or None if it started over."""
    learner = self.make_learner(m)
    ckpt = self.learner_ckpts[m]
    ckpt.reopen()
    step = ckpt.restore_into(learner, self.data_iters[m])
    if step is None:
      self.data_iters[m].set_state(self._initial_iters[m])
      n = learner.frag.num_fragments
      learner.global_copy = [{} for _ in range(n)]
      learner.versions = [-1] * n
    return learner, step

  def restore_sync(self, make_sync: Callable[[], Synchronizer], generation: int) -> Synchronizer:
    """A new synchronizer from the newest checkpoint, beginning `generation`."""
    if self.sync_ckpt is None:
      raise ValueError(
          "the synchronizer cannot restart: its checkpoints are off "
          "(set outer.sync_checkpoint_every > 0)"
      )
    sync = make_sync()
    self.sync_ckpt.reopen()
    state = self.sync_ckpt.restore(sync.state_dict())
    sync.restart(state, max(generation, state["meta"]["generation"] + 1))
    return sync

  def restore_shard(self, make_sync: Callable[[], Any], shard: int, generation: int):
    """Synchronizer shard `shard` alone from the newest joint checkpoint of a virtual run's
    shards, beginning `generation` (or its own next one)."""
    if self.sync_ckpt is None:
      raise ValueError("a shard cannot restart: synchronizer checkpoints are off")
    joint = make_sync()
    self.sync_ckpt.reopen()
    state = self.sync_ckpt.restore(joint.state_dict())
    return joint.restart_shard(shard, state, generation)

  def close(self) -> None:
    for ckpt in self.learner_ckpts:
      ckpt.close()
    if self.sync_ckpt is not None:
      self.sync_ckpt.close()
