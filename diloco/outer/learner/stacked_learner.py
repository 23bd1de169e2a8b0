"""A learner whose train state is one row of a stack of learners (inner/stacked.py).

It is a `Learner` in every respect the runtimes see; only where its state lives differs: a step
is queued on the stack, and reading or writing its parameters, or its whole state (checkpoints,
restores, a crash that forgets it), runs what it has queued first. Used by the virtual runtime
when `outer.stack_learners` is on.
"""

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from diloco.inner import stacked, step as step_lib
from diloco.outer.learner.learner import Learner


class StackedLearner(Learner):
  """Learner `index` on row `row` of `stack`."""

  def __init__(self, *args, stack: stacked.Stack, row: int, **kwargs):
    self.stack, self.row, self._held = stack, row, False  # before the base assigns `state`
    super().__init__(*args, **kwargs)

  @property
  def state(self) -> step_lib.TrainState | None:
    """This learner's slice of the stack, on its island's devices (None once forgotten)."""
    if not self._held:
      return None
    return jax.device_put(self.stack.get_state(self.row), self.island.fns.state_shardings)

  @state.setter
  def state(self, value: step_lib.TrainState | None) -> None:
    if value is None:  # forgotten (a crash): what it queued still runs, its metrics stay readable
      self.stack.flush(self.row)
    else:
      self.stack.set_state(self.row, value)
    self._held = value is not None

  def host_params(self) -> dict[str, np.ndarray]:
    return self.stack.read(self.row, self.stack.paths)

  def _train(self, batch: dict[str, np.ndarray]) -> Mapping[str, Any]:
    return self.stack.enqueue(self.row, batch)

  def _read(self, p: int) -> dict[str, np.ndarray]:
    return self.stack.read(self.row, self.frag.paths[p])

  def _write(self, values: Mapping[str, np.ndarray]) -> None:
    self.stack.write(self.row, values)
