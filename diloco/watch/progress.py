"""Progress bars (tqdm) for every long run: shown on a terminal only, and never when the run's
`progress_bar` is False. Bars opened while another is open stack below it (tqdm places them)."""

import time
from typing import Any

import tqdm


def bar(enabled: bool, **kwargs: Any) -> tqdm.tqdm:
  """A tqdm bar: off when `enabled` is False, and (tqdm's `disable=None`) when stderr is not a
  terminal, so logs and captured test output stay free of carriage returns."""
  return tqdm.tqdm(disable=None if enabled else True, dynamic_ncols=True, **kwargs)


class Throttle:
  """True at most once per `every_s` seconds: postfixes are formatted only when shown."""

  def __init__(self, every_s: float = 0.5, clock=time.monotonic):
    self.every_s, self.clock, self._last = every_s, clock, -float("inf")

  def __call__(self) -> bool:
    now = self.clock()
    if now - self._last < self.every_s:
      return False
    self._last = now
    return True


def learners_postfix(sim_time_s: float, merges: int, steps: list[int]) -> dict[str, str]:
  """What a multi-learner bar says: simulated time, merges, and the slowest and fastest learner
  (their index and steps)."""
  slow = min(range(len(steps)), key=lambda m: (steps[m], m))
  fast = max(range(len(steps)), key=lambda m: (steps[m], -m))
  return {
      "sim": f"{sim_time_s:.0f}s",
      "merges": str(merges),
      "slowest": f"L{slow}@{steps[slow]}",
      "fastest": f"L{fast}@{steps[fast]}",
  }


def modes_postfix(modes: list[str], done: int) -> dict[str, str]:
  """What mode=compare's bar says: the mode running and those done."""
  out = {"running": modes[done] if done < len(modes) else "-"}
  out["done"] = ",".join(modes[:done]) or "-"
  return out
