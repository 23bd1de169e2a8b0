"""The fault layer: what a schedule's faults do to one learner's messages and steps, at a time.

Every runtime asks it (the virtual clock, the threads runtime's links and timeline, a gRPC learner
process), so the seven kinds mean one thing everywhere. It holds no clock and does no I/O: time is
schedule seconds, passed in; what to do with a dropped message, a held one or a crash (push an
event, sleep, raise, exit) is the runtime's.

- delay +d: a message sent at t arrives d later (delays add up);
- partition hold: nothing crosses before the partition ends; drop: messages are lost;
- corrupt (up/down) and poison: armed at their time (the virtual runtime arms each at its event,
  so that faults past the token budget stay unarmed; real-time runtimes arm the whole schedule and
  let time decide), a fault is carried by the next message in its direction, once;
- straggle xf: steps take f times as long (factors multiply);
- crash: the learner is down for the fault's window; sync_crash is the synchronizer's, not a
  learner's, and never acts here.
"""

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from diloco.chaos import schedule as chaos
from diloco.outer import protocol

TAINTS = ("corrupt", "poison")


class FaultLayer:
  """The message- and step-level faults of one run's schedule (see the module doc)."""

  def __init__(self, faults: list[chaos.Fault], armed: bool = True):
    self.faults = list(faults)
    self.armed: list[chaos.Fault] = [f for f in self.faults if f.kind in TAINTS] if armed else []

  def active(self, m: int, kind: str, t: float) -> list[chaos.Fault]:
    """Learner m's faults of `kind` active at t, in schedule order."""
    return [f for f in self.faults if f.kind == kind and f.learner == m and f.active(t)]

  def arm(self, f: chaos.Fault) -> None:
    """A corrupt or poison fault whose time has come (for a layer built with armed=False)."""
    if f.kind not in TAINTS:
      raise ValueError(f"only {TAINTS} faults are armed, not {f.describe()}")
    self.armed.append(f)

  @property
  def unused(self) -> int:
    """Armed faults no message carried."""
    return len(self.armed)

  # ---- steps ----

  def stretch(self, m: int, t: float, duration: float = 1.0) -> float:
    """A step of `duration` started at t, as long as learner m's stragglers make it."""
    for f in self.active(m, "straggle", t):
      duration *= f.factor
    return duration

  def crash(self, m: int, t: float, since: float = -math.inf) -> chaos.Fault | None:
    """The crash that has learner m down at t and began at or after `since`, if any."""
    return next((f for f in self.active(m, "crash", t) if f.time_s >= since), None)

  def down_until(self, m: int, t: float) -> float | None:
    """When every crash learner m is inside at t is over (None: it is not down)."""
    ends = [f.end_s for f in self.active(m, "crash", t)]
    return max(ends) if ends else None

  # ---- the link ----

  def partition_end(self, m: int, t: float, mode: str) -> float | None:
    """When the partitions of `mode` ('hold' or 'drop') active at t end (None: none is)."""
    ends = [f.end_s for f in self.active(m, "partition", t) if f.mode == mode]
    return max(ends) if ends else None

  def delay(self, m: int, t: float) -> float:
    """Seconds the delays active at t add to a message of learner m's link."""
    return sum(f.factor for f in self.active(m, "delay", t))

  def arrival(
      self, m: int, t: float, transfer_s: float = 0.0
  ) -> tuple[float | None, chaos.Fault | None]:
    """When a message of learner m's link sent at t, `transfer_s` long on a healthy link,
    arrives, and None; or (None, the partition) if a dropping partition loses it."""
    arrival = t + transfer_s + self.delay(m, t)
    for f in self.active(m, "partition", t):
      if f.mode == "drop":
        return None, f
      arrival = max(arrival, f.end_s)
    return arrival, None

  def _take(self, m: int, t: float, wanted: Callable[[chaos.Fault], bool]) -> chaos.Fault | None:
    f = next((f for f in self.armed if f.learner == m and f.time_s <= t and wanted(f)), None)
    if f is not None:
      self.armed.remove(f)
    return f

  def taint_up(
      self, up: protocol.Upload, t: float, rng: np.random.Generator
  ) -> tuple[protocol.Upload, chaos.Fault | None]:
    """The upload as it leaves with the next armed corrupt-up or poison fault of its learner,
    and that fault (None: untouched). Poison acts at the source (the checksum is computed over
    it), corruption in transit (after the checksum)."""
    f = self._take(up.learner, t, lambda f: f.kind == "poison" or f.mode == "up")
    if f is None:
      return up, None
    if f.kind == "poison":
      delta = chaos.poison(up.delta, f.mode, f.factor)
      return dataclasses.replace(up, delta=delta, checksum=None), f
    return dataclasses.replace(up, delta=chaos.flip_bits(up.delta, rng)), f

  def taint_down(
      self, send: protocol.Send, t: float, rng: np.random.Generator
  ) -> tuple[protocol.Send, chaos.Fault | None]:
    """The send as it reaches its learner with the next armed corrupt-down fault, and that
    fault (None: untouched); bits flip after the synchronizer's checksum."""
    f = self._take(send.learner, t, lambda f: f.kind == "corrupt" and f.mode == "down")
    if f is None:
      return send, None
    field = "update" if send.update is not None else "values"
    return dataclasses.replace(send, **{field: chaos.flip_bits(getattr(send, field), rng)}), f


def taint_name(f: chaos.Fault) -> str:
  """How statistics name a tainted message's fault: 'corrupt_up', 'poison_nan', ..."""
  return f"{f.kind}_{f.mode}"
