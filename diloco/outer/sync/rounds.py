"""One fragment's merge round: what it holds, when it merges, and the line that records a merge.

A round opens with its first upload. Once `policy.quorum` of the group (live learners, or every
member with `Quorum.of_members`, less those the round no longer waits for) have uploaded, the grace
window opens (`policy.grace`, from the EMAs of step time, time to quorum and round trip); the
round merges when the window ends (a timer) or when the whole group has uploaded, whichever is
first. With no grace window it merges at the quorum.

Under the period merge clock (merge_clock.py) a round also has a scheduled time, `due`: before it
the round waits (a timer at `due`) unless every learner of the group has uploaded; at `due` it
merges if the quorum's uploads had arrived by then, else it waits for the K-th upload and opens
the grace window from there as above (its time to quorum counted from `due`).
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
  wake_s: float | None = None  # period clock: the timer set for the scheduled merge


def advance(
    rnd: Round,
    group: set[int],
    policy: policies.Policy,
    now: float,
    ema_step: policies.Ema,
    ema_quorum: policies.Ema,
    ema_sync: policies.Ema,
    due: float | None = None,
) -> SetTimer | str | None:
  """What round `rnd` does at `now`: None (wait), a SetTimer (the grace window opened, or the
  scheduled merge's timer) or MERGE. Reaching the quorum records its time in the round and feeds
  `ema_quorum`. `due`: the period clock's scheduled merge (None: the arrival clock)."""
  pending = rnd.pending
  if due is not None and rnd.quorum_s is None:
    if now < due and not (pending and group.issubset(pending)):
      if not pending or rnd.wake_s == due:
        return None
      rnd.wake_s = due
      return SetTimer(due)
    if _quorum_by(rnd, group, policy, due):
      return MERGE  # on schedule, or everyone in before it
  if not pending or len(group.intersection(pending)) < policy.quorum.required(len(group)):
    return None
  everyone = group.issubset(pending)
  if rnd.quorum_s is None:
    rnd.quorum_s = now
    opened = rnd.first_upload_s if due is None else due
    ema_quorum.update(now - opened)
    grace = policy.grace.window(ema_step.get(), ema_quorum.get(), ema_sync.get())
    if grace > 0 and not everyone:
      rnd.deadline_s = now + grace
      return SetTimer(now + grace)
  elif rnd.deadline_s is not None and not everyone:
    return None  # still inside the grace window
  return MERGE


def _quorum_by(rnd: Round, group: set[int], policy: policies.Policy, due: float) -> bool:
  """Whether the group's uploads in `rnd` that had arrived by `due` make the quorum."""
  arrived = [u for m, u in rnd.pending.items() if m in group and u.time <= due]
  return bool(arrived) and len(arrived) >= policy.quorum.required(len(group))


def on_time(rnd: Round) -> bool:
  """Whether a round merged without waiting for its quorum past its scheduled time."""
  return rnd.quorum_s is None


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
      "arrived": [u.time for u in ups],  # (when each upload arrived, on the merge's clock)
  }
