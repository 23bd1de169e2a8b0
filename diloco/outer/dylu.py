"""Dynamic local updates (DyLU, Liu et al. 2024, arXiv 2401.09135, eq. 6), measured.

Learner m's inner steps between two syncs of a fragment are H_m = max(1, ⌊v_m / v_max · H⌋), v the
speed in steps per second: the fastest learner keeps H and a learner half as fast syncs every H/2
steps, so that rounds take about the same time everywhere and a slow learner's outer gradients are
neither stale nor few. Speeds are measured, not configured: the synchronizer keeps an exponential
moving average of the step time each learner reports with its uploads, and sends H_m along with
every fragment it sends that learner (protocol.Send.inner_steps); a learner not yet measured keeps
its schedule.
"""

import math

from diloco.outer import policies


class Dylu:
  """Per-learner step-time averages and the inner steps they give."""

  def __init__(self, inner_steps: int, decay: float):
    if inner_steps < 1:
      raise ValueError(f"DyLU needs inner_steps >= 1, got {inner_steps}")
    self.inner_steps, self.decay = inner_steps, decay
    self.step_s: dict[int, policies.Ema] = {}

  def observe(self, learner: int, step_time: float) -> None:
    if step_time > 0 and math.isfinite(step_time):
      self.step_s.setdefault(learner, policies.Ema(self.decay)).update(step_time)

  def steps_for(self, learner: int, live: set[int]) -> int:
    """H_m for `learner` against the fastest live learner measured; 0 if it is not measured."""
    if learner not in self.step_s:
      return 0
    fastest = min(self.step_s[m].get() for m in live | {learner} if m in self.step_s)
    return max(1, math.floor(self.inner_steps * fastest / self.step_s[learner].get() + 1e-9))
