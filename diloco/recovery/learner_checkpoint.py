"""Orbax checkpoints of one learner: train state, data iterator, counters and fragment versions.

A learner saves every `every` inner steps into its own directory; orbax writes each save into a
temporary directory and commits it when complete, so a crash during a save leaves the previous
one as the newest, and no restore reads a save that was not committed. A learner process
(rpc/learner_main.py, one learner per process) saves asynchronously (`async_save`): the save
copies the state off the devices (and the host arrays; the data iterator's position is written at
once) and returns, and training goes on while orbax writes it. The next save, a restore, a stop
(`save_now`, on SIGTERM) and `close` first wait for the save in flight to commit.

The runtimes that hold several learners in one process (threads) save synchronously: several
orbax managers saving asynchronously from threads of one process timed out waiting on orbax's
signalling keys (a CI run, 2026-12-05). Asynchronous saves of learner processes were taken back
once (5a71309) for a CI failure of test_learner_process.py's restart; that failure came from the
synchronizer's settling (runtime/sync_host.py, `settled`) and failed with synchronous saves too.
"""

from diloco import paths
from diloco.inner import checkpoint
from diloco.outer.learner.learner import Learner


class LearnerCheckpointer:
  """Saves and restores one learner; `every` = 0 never saves (restore then finds nothing)."""

  def __init__(self, directory: str, every: int, keep: int = 2, async_save: bool = False):
    if every < 0:
      raise ValueError(f"learner checkpoint interval must be >= 0, got {every}")
    self.directory, self.every, self.keep = paths.absolute(directory), every, keep
    self.async_save = async_save  # (one learner in the process: see the module doc)
    self._ckpt: checkpoint.Checkpointer | None = None

  def _manager(self) -> checkpoint.Checkpointer:
    if self._ckpt is None:
      self._ckpt = checkpoint.Checkpointer(
          self.directory, max(self.every, 1), keep=self.keep, async_save=self.async_save
      )
    return self._ckpt

  def maybe_save(self, learner: Learner, data_iter) -> bool:
    """Saves if `learner.steps` is a multiple of `every`; returns whether it saved."""
    if not self.every or learner.steps % self.every:
      return False
    return self._manager().save(learner.steps, learner.checkpoint_state(), data_iter, force=True)

  def save_now(self, learner: Learner, data_iter) -> bool:
    """Saves at the learner's current step whatever `every` says (a stop on SIGTERM), unless
    checkpoints are off; returns whether that step is saved, now or by the scheduled save made
    at it already (a stop right after one: CI once saw that race as not saved)."""
    if not self.every:
      return False
    manager = self._manager()
    manager.wait()  # (a scheduled save of this very step may still be in flight)
    if manager.latest_step() != learner.steps:
      manager.save(learner.steps, learner.checkpoint_state(), data_iter, force=True)
      manager.wait()  # committed (or failed) before the process ends
    return manager.latest_step() == learner.steps

  def wait(self) -> None:
    """Returns once the save in flight, if any, is committed (or has failed, logged)."""
    if self._ckpt is not None:
      self._ckpt.wait()

  def latest_step(self) -> int | None:
    if not self.every:
      return None
    return self._manager().latest_step()

  def restore_into(self, learner: Learner, data_iter) -> int | None:
    """Loads the newest checkpoint into `learner`, rewinds `data_iter`; its step, or None."""
    if self.latest_step() is None:
      return None
    step, saved = self._manager().restore(learner.checkpoint_like(), data_iter)
    learner.load_checkpoint_state(saved)
    return step

  def reopen(self) -> None:
    """Forgets the open manager, as a restarted process would, and reads the directory anew."""
    if self._ckpt is not None:
      self._ckpt.close()
    self._ckpt = None

  def close(self) -> None:
    if self._ckpt is not None:
      self._ckpt.close()
      self._ckpt = None
