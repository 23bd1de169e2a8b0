"""The message half of the chaos runtime (`virtual_chaos.ChaosRuntime`): faulty links and what a
learner does when the synchronizer refuses what it sent.

- delay adds latency to messages sent in the window (both ways); partition holds them to the end
  of the window ('hold') or drops them ('drop'): when it ends the learner re-joins, to be sent what
  it missed, and sends again, computed afresh, the uploads that were dropped (it learned of each
  failed send).
- corrupt flips bits in the next payload after its checksum; poison replaces the next upload by
  NaN/Inf/huge values at the source. Each tainted message is followed to its fate: rejected
  (by reason), merged (a failure of the checks), superseded, or lost.
- what a learner does about a refused upload or a merged fragment it cannot apply is its
  machine's (outer/learner_machine.py); the base runtime carries it out.

`FaultyMessages` is a mixin: it uses the ChaosRuntime's state (its fault layer, taint records,
learners, clocks, the event queue) and is not meant to stand alone. What each fault does to a
message is the fault layer's (chaos/faults.py); this module routes messages through it.
"""

import dataclasses

from diloco.chaos import faults, schedule as chaos
from diloco.outer import protocol
from diloco.runtime.virtual import AT_LEARNER, AT_SYNC, SYNC


class FaultyMessages:
  """Sending up and down through links with the schedule's message faults (`self.layer`)."""

  def _link(self, m: int, nbytes: int) -> float | None:
    """Arrival time of a message of learner m's link sent now (None: dropped; learner m
    re-joins once the partition that dropped it is over)."""
    arrival, dropped = self.layer.arrival(m, self.now, self.net.delay(nbytes))
    if dropped is not None and (m, dropped.time_s) not in self._heals:
      self._heals.add((m, dropped.time_s))
      self._push(dropped.end_s, AT_LEARNER, "heal", m, owner=m)
    return arrival

  def _on_heal(self, m: int) -> None:
    self._resync(m)
    for p, base in sorted(self._owed[m].items()):  # sent again at once, if still wanted
      self._resend(m, p, base)
    self._owed[m].clear()

  def _send_up(self, m: int, message: protocol.Upload | protocol.Join) -> None:
    is_upload = isinstance(message, protocol.Upload)
    if not self.sync_up:  # unanswered uploads are sent again at the restart
      return
    arrival = self._link(m, message.nbytes if is_upload else 0)
    if arrival is None:
      self.stats.dropped["up"] += 1
      if is_upload:  # the sender learns of it, and sends it again when the link is back
        self._owed[m][message.fragment] = (message.base_generation, message.base_version)
      else:
        self.machines[m].join_lost()
      return
    if is_upload:
      message, f = self.layer.taint_up(message, self.now, self.rng)
      if f is not None:
        self._count_taint(f, m)
        self.taints.sent_up(message, faults.taint_name(f))
      self.bytes_up[m] += message.nbytes
    self._push(arrival, AT_SYNC, "at_sync", dataclasses.replace(message, time=arrival), owner=SYNC)

  def _count_taint(self, f: chaos.Fault, m: int) -> None:
    self.stats.faults[f.kind] += 1
    self._log({"event": "fault", "kind": f.kind, "learner": m, "fault": f.describe()})

  def _send_down(self, send: protocol.Send) -> None:
    m = send.learner
    arrival = self._link(m, send.nbytes) if self.up[m] else None
    if arrival is None:
      self.stats.dropped["down"] += 1
      return
    send, f = self.layer.taint_down(send, self.now, self.rng)
    if f is not None:
      self._count_taint(f, m)
      self.taints.sent_down(send, faults.taint_name(f))
    self.bytes_down[m] += send.nbytes
    self._push(arrival, AT_LEARNER, "at_learner", send, owner=m)

  def _on_at_sync(self, event: protocol.Event) -> None:
    self._handle(event)

  def _on_timer(self, _) -> None:
    self._handle(protocol.Tick(self.now))

  def _on_reject(self, refused: protocol.Refused) -> None:
    if self.up[refused.learner]:  # (a crashed learner's machine learns nothing)
      super()._on_reject(refused)
