"""The message half of a virtual run's faults (`virtual_chaos.Chaos` holds one `FaultyMessages`):
faulty links, and what a learner does when a partition that dropped its messages heals.

- delay adds latency to messages sent in the window (both ways); partition holds them to the end
  of the window ('hold') or drops them ('drop'): when it ends the learner re-joins, to be sent what
  it missed, and sends again, computed afresh, the uploads that were dropped (it learned of each
  failed send).
- corrupt flips bits in the next payload after its checksum; poison replaces the next upload by
  NaN/Inf/huge values at the source. Each tainted message is followed to its fate: rejected
  (by reason), merged (a failure of the checks), superseded, or lost.
- what a learner does about a refused upload or a merged fragment it cannot apply is its
  machine's (outer/learner/learner_machine.py); the runtime carries it out.

What each fault does to a message is the fault layer's (chaos/faults.py); this module routes
messages through it, for the `Chaos` whose layer, random generator, statistics and taint records
it uses, and through it the runtime (the clock, the event queue, the learners' machines).
"""

from typing import Any

from diloco.chaos import faults, schedule
from diloco.outer import protocol
from diloco.runtime.virtual import AT_LEARNER
from diloco.runtime.virtual_hooks import Message


class FaultyMessages:
  """Messages up and down through links with the schedule's message faults (`chaos.layer`)."""

  def __init__(self, chaos: Any, learners: int):
    self.chaos = chaos  # a virtual_chaos.Chaos
    self.heals: set[tuple[int, float]] = set()  # (learner, partition start): heal scheduled
    self.owed: list[dict[int, tuple]] = [{} for _ in range(learners)]  # p -> base, dropped

  def _link(self, m: int, delay: float) -> float | None:
    """Arrival time of a message of learner m's link sent now (None: dropped; learner m
    re-joins once the partition that dropped it is over)."""
    rt = self.chaos.runtime
    arrival, dropped = self.chaos.layer.arrival(m, rt.now, delay)
    if dropped is not None and (m, dropped.time_s) not in self.heals:
      self.heals.add((m, dropped.time_s))
      rt.push(dropped.end_s, AT_LEARNER, "heal", m, owner=m)
    return arrival

  def heal(self, m: int) -> None:
    """Learner m's partition that dropped messages is over: it re-joins, and sends again at
    once, if still wanted, the uploads that were dropped."""
    self.chaos.resync(m)
    for p, base in sorted(self.owed[m].items()):
      self.chaos.runtime.resend(m, p, base)
    self.owed[m].clear()

  def send_up(self, m: int, message: Message, delay: float) -> tuple[float, Message] | None:
    """When learner m's message arrives, and as what (None: dropped)."""
    c = self.chaos
    is_upload = isinstance(message, protocol.Upload)
    arrival = self._link(m, delay)
    if arrival is None:
      c.stats.dropped["up"] += 1
      if is_upload:  # the sender learns of it, and sends it again when the link is back
        self.owed[m][message.fragment] = (message.base_generation, message.base_version)
      else:
        c.runtime.machines[m].join_lost()
      return None
    if is_upload:
      message, f = c.layer.taint_up(message, c.runtime.now, c.rng)
      if f is not None:
        self._count_taint(f, m)
        c.taints.sent_up(message, faults.taint_name(f))
    return arrival, message

  def _count_taint(self, f: schedule.Fault, m: int) -> None:
    self.chaos.stats.faults[f.kind] += 1
    self.chaos.log({"event": "fault", "kind": f.kind, "learner": m, "fault": f.describe()})

  def send_down(self, send: protocol.Send, delay: float) -> tuple[float, protocol.Send] | None:
    """When a Send arrives at its learner, and as what (None: dropped, or its learner is
    down)."""
    c, m = self.chaos, send.learner
    arrival = self._link(m, delay) if c.up[m] else None
    if arrival is None:
      c.stats.dropped["down"] += 1
      return None
    send, f = c.layer.taint_down(send, c.runtime.now, c.rng)
    if f is not None:
      self._count_taint(f, m)
      c.taints.sent_down(send, faults.taint_name(f))
    return arrival, send
