"""One crash-and-rejoin machine for every runtime (sans-I/O): what a crashed learner loses, where
it resumes, and when it has rejoined.

A runtime tells it what happened (`crash`, `recover`, `rejoined`) and does what it says; every
runtime drives it, each with its own clock and its own way of restoring (diloco/recovery/
rejoin.py): the virtual runtime, the threads runtime, and a restarted learner process
(diloco/rpc/learner_rejoin.py, which learns its peers from its Join's answer). It keeps the crash
records a run's summary reports (`crashes`, `steps_lost`).

Where a recovered learner resumes (`resume_step`): its step counter paces its fragment schedule,
so it moves forward to the phase (modulo H) of the leading live learner's, and its uploads go
with the others' again. Restarting the schedule from an older checkpoint's step would put it out
of phase for the rest of the run: Decoupled DiLoCo would then merge its fragments apart from the
others', each through the outer optimizer on its own, and lockstep rounds of different fragments
would wait on each other. Where lockstep rounds wait for it (`lockstep`: blocking learners and a
quorum of members, synchronous DiLoCo without elasticity) it resumes instead at the leading
learner's last merge point (the step after which that one last received a fragment), or at its own
checkpoint's step if later: it redoes the rounds still open, as a restarted synchronous worker
must, while the others wait. With no live peer it resumes at its own step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Peer:
  """A live learner other than the one resuming: its step counter, and its steps since it last
  received each fragment (`Learner.c_steps`)."""

  steps: int
  c_steps: tuple[int, ...]


def resume_step(own: int, inner_steps: int, peers: Sequence[Peer], lockstep: bool) -> int:
  """The step counter a learner restored at step `own` resumes at (see the module doc)."""
  if not peers:
    return own
  lead = max(peers, key=lambda p: p.steps)
  if lockstep:
    return max(own, lead.steps - min(lead.c_steps))
  return own + (lead.steps - own) % inner_steps


class CrashMachine:
  """The crashes and rejoins of one run's learners."""

  def __init__(self, learners: int, lockstep: bool):
    self.lockstep = lockstep
    self.crashes: list[dict[str, Any]] = []  # every crash's record, in order
    self.steps_lost = [0] * learners
    self.rejoining: dict[int, dict[str, Any]] = {}  # learner -> its record, until rejoined

  def crash(
      self, m: int, now: float, back: float, steps_lost: int | None = None, **extra
  ) -> dict[str, Any]:
    """Learner m crashed at `now`, back at `back`; `steps_lost` when the runtime knows them now
    (else `recover` counts them). Returns its record (a runtime may add keys)."""
    if m in self.rejoining:  # back, but crashed again before its rejoin was complete
      self.rejoining[m]["crashed_again"] = now
    record = {
        "learner": m,
        "time": now,
        "back": back,
        "rejoined": None,
        "restored_step": None,
        "steps_lost": steps_lost,
        **extra,
    }
    if steps_lost is not None:
      self.steps_lost[m] += steps_lost
    self.crashes.append(record)
    self.rejoining[m] = record
    return record

  def recover(
      self,
      m: int,
      restored_step: int | None,
      steps: int,
      inner_steps: int,
      peers: Sequence[Peer],
      steps_at_crash: int | None = None,
  ) -> int:
    """Learner m is back, restored at `restored_step` (None: it starts over) with step counter
    `steps` and H = `inner_steps`; returns the step counter it resumes at. `steps_at_crash`: its
    counter when it crashed, when the steps it lost were not known then."""
    record = self.rejoining[m]
    record["restored_step"] = restored_step
    if record["steps_lost"] is None and steps_at_crash is not None:
      record["steps_lost"] = steps_at_crash - (restored_step or 0)
      self.steps_lost[m] += record["steps_lost"]
    return resume_step(steps, inner_steps, peers, self.lockstep)

  def is_rejoining(self, m: int) -> bool:
    return m in self.rejoining

  def rejoined(self, m: int, now: float, **extra) -> dict[str, Any]:
    """Learner m holds the global fragments again (its rejoin is complete); its record."""
    record = self.rejoining.pop(m)
    record.update(rejoined=now, **extra)
    return record


def rejoin_complete(versions: Sequence[int], answered: Sequence[int] | None) -> bool:
  """Whether a learner holding `versions` holds at least those its Join was answered with."""
  return answered is not None and all(v >= t for v, t in zip(versions, answered))


def peers_of(learners: Sequence[Any], up: Sequence[bool], m: int) -> list[Peer]:
  """The live learners other than m, as `resume_step` sees them."""
  return [Peer(l_.steps, tuple(l_.c_steps)) for i, l_ in enumerate(learners) if up[i] and i != m]
