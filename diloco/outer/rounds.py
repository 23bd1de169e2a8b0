"""One fragment's merge round: what it holds, when it merges, and the line that records a merge.

A round opens with its first upload. Once `policy.quorum` of the group (live learners, or every
member with `Quorum.of_members`, less those the round no longer waits for) have uploaded, the grace
window opens (`policy.grace`, from the EMAs of step time, time to quorum and round trip); the
round merges when the window ends (a timer) or when the whole group has uploaded, whichever is
first. With no grace window it merges at the quorum.
"""

import dataclasses

import numpy as np

from diloco.outer import policies
from diloco.outer.protocol import SetTimer, Upload

MERGE = "merge"  # `advance`'s answer: merge the round now


@dataclasses.dataclass
class Round:
  """One fragment's round in progress: what merges next, and when."""

  pending: dict[int, Upload] = dataclasses.field(default_factory=dict)  # learner -> upload
  abstaining: set[int] = dataclasses.field(default_factory=set)  # refused now: not waited for
  first_upload_s: float | None = None
  quorum_s: float | None = None  # when the quorum was reached
  deadline_s: float | None = None  # the grace window's end


def advance(
    rnd: Round,
    group: set[int],
    policy: policies.Policy,
    now: float,
    ema_step: policies.Ema,
    ema_quorum: policies.Ema,
    ema_sync: policies.Ema,
) -> SetTimer | str | None:
  """What round `rnd` does at `now`: None (wait), a SetTimer (the grace window opened) or MERGE.
  Reaching the quorum records its time in the round and feeds `ema_quorum`."""
  pending = rnd.pending
  if not pending or len(group.intersection(pending)) < policy.quorum.required(len(group)):
    return None
  everyone = group.issubset(pending)
  if rnd.quorum_s is None:
    rnd.quorum_s = now
    ema_quorum.update(now - rnd.first_upload_s)
    grace = policy.grace.window(ema_step.get(), ema_quorum.get(), ema_sync.get())
    if grace > 0 and not everyone:
      rnd.deadline_s = now + grace
      return SetTimer(now + grace)
  elif rnd.deadline_s is not None and not everyone:
    return None  # still inside the grace window
  return MERGE


def merge_record(
    p: int,
    now: float,
    version: int,
    quorum_s: float | None,
    ups: list[Upload],
    weights: np.ndarray,
    staleness: list[int],
    clipped: set[int],
) -> dict:
  """The 'merge' log line of fragment p's round just committed as `version`."""
  return {
      "event": "merge",
      "time": now,
      "fragment": p,
      "version": version,
      "quorum": len(ups),
      "learners": [u.learner for u in ups],
      "weights": [float(w) for w in weights / weights.sum()],  # normalised, as merged
      "staleness": staleness,
      "grace_s": now - quorum_s if quorum_s is not None else 0.0,
      "steps": [u.steps for u in ups],
      "tokens": [u.tokens for u in ups],
      "clipped": sorted(clipped & {u.learner for u in ups}),
  }
