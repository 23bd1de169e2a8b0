"""The restart window of asynchronous Local-SGD as its authors' toy runs it (policy.restart_window_s).

A merge's contributors are not answered at once: the first of a window sets its end, window_s
later; every contributor merged until then waits too. At the end, or as soon as every live learner
waits, all of them are sent the newest version of what they wait for and restart together. Sans
I/O, like the synchronizer that holds it: it names who is due and asks for a timer.
"""

from __future__ import annotations

from diloco.outer.protocol import SetTimer


class RestartWindow:

  def __init__(self, window_s: float):
    if not window_s > 0:
      raise ValueError(f"restart window must be > 0 s, got {window_s}")
    self.window_s = window_s
    self.waiting: dict[int, dict[int, tuple | None]] = {}  # learner -> fragment -> own key
    self.release_s: float | None = None

  def hold(self, learners, p: int, own: dict, now: float) -> list[SetTimer]:
    """Holds back fragment p's answer to `learners` (`own`: learner -> its merged upload's key);
    the timer of a window this opens."""
    for m in learners:
      self.waiting.setdefault(m, {})[p] = own.get(m)
    if self.release_s is not None:
      return []
    self.release_s = now + self.window_s
    return [SetTimer(self.release_s)]

  def drop(self, learner: int) -> None:
    """A learner that left waits no more."""
    self.waiting.pop(learner, None)

  def release(self, now: float, live: set[int]) -> list[tuple[int, int, tuple | None]]:
    """(learner, fragment, own key) to answer now: all held, once the window has ended or every
    live learner waits; else none."""
    if self.release_s is None or (now < self.release_s and not live <= set(self.waiting)):
      return []
    waiting, self.waiting, self.release_s = self.waiting, {}, None
    return [
        (m, p, key) for m in sorted(waiting) if m in live for p, key in sorted(waiting[m].items())
    ]
