"""The message half of the chaos runtime (`virtual_chaos.ChaosRuntime`): faulty links and what a
learner does when the synchronizer refuses what it sent.

- delay adds latency to messages sent in the window (both ways); partition holds them to the end
  of the window ('hold') or drops them ('drop'): when it ends the learner re-joins, to be sent what
  it missed, and sends again, computed afresh, the uploads that were dropped (it learned of each
  failed send).
- corrupt flips bits in the next payload after its checksum; poison replaces the next upload by
  NaN/Inf/huge values at the source. Each tainted message is followed to its fate: rejected
  (by reason), merged (a failure of the checks), superseded, or lost.
- an upload refused for its base version makes its learner re-join; one that arrived corrupt is
  sent again, once, computed afresh.

`FaultyMessages` is a mixin: it uses the ChaosRuntime's state (faults, taints, learners, clocks,
the event queue) and is not meant to stand alone.
"""

import dataclasses

from diloco.chaos import schedule as chaos
from diloco.outer import protocol
from diloco.outer.outcomes import Code
from diloco.runtime.virtual import AT_LEARNER, AT_SYNC, START, SYNC

RESYNC_CODES = (Code.UNKNOWN_BASE_VERSION, Code.STALE, Code.DUPLICATE)  # its base is off: re-join
RESEND_CODES = (Code.CHECKSUM,)  # corrupted in transit: send it again (its round waits for it)


class FaultyMessages:
  """Sending up and down through links with the schedule's message faults applied."""

  def _link(self, m: int, nbytes: int) -> tuple[float | None, chaos.Fault | None]:
    """Arrival time of a message of learner m's link sent now (None: dropped), and the
    partition that dropped or held it."""
    arrival = self.now + self.net.delay(nbytes) + sum(f.factor for f in self._active(m, "delay"))
    for f in self._active(m, "partition"):
      if f.mode == "drop":
        if (m, f.time_s) not in self._heals:  # re-join once it is over
          self._heals.add((m, f.time_s))
          self._push(f.end_s, AT_LEARNER, "heal", m, owner=m)
        return None, f
      arrival = max(arrival, f.end_s)
    return arrival, None

  def _on_heal(self, m: int) -> None:
    self._resync(m)
    for p, base in sorted(self._owed[m].items()):
      self._resend(m, p, base)
    self._owed[m].clear()

  def _on_resend(self, payload: tuple[int, int, tuple]) -> None:
    self._resend(*payload)

  def _resend(self, m: int, p: int, base: tuple[int, int] | None = None) -> None:
    """Learner m uploads fragment p again, computed afresh (more progress, same base), unless
    it received another version since the upload on `base` (generation, version): that round
    is over, and its progress goes with its next scheduled upload."""
    learner, clock = self.learners[m], self.clocks[m]
    same = base is None or base == (learner.generations[p], learner.versions[p])
    if same and learner.c_steps[p] > 0 and learner.versions[p] >= 0:
      clock.inflight.setdefault(p, learner.steps)
      self._resends.add((m, p, self.now))
      self._send_up(
          m, learner.upload(p, sent_time=self.now, arrival_time=0.0, step_time=clock.step_s)
      )
    elif clock.inflight.pop(p, None) is not None and clock.waiting_since is not None:
      self._push(self.now, START, "start", m, owner=m)

  def _send_up(self, m: int, message: protocol.Upload | protocol.Join) -> None:
    is_upload = isinstance(message, protocol.Upload)
    if not self.sync_up:  # unanswered uploads are sent again at the restart
      return
    arrival, _ = self._link(m, message.nbytes if is_upload else 0)
    if arrival is None:
      self.stats.dropped["up"] += 1
      if is_upload:  # the sender learns of it, and sends it again when the link is back
        self._owed[m][message.fragment] = (message.base_generation, message.base_version)
      else:
        self._join_inflight[m] = False
      return
    if is_upload:
      message = self._taint_up(m, message)
      self.bytes_up[m] += message.nbytes
    self._push(arrival, AT_SYNC, "at_sync", dataclasses.replace(message, time=arrival), owner=SYNC)

  def _taint_up(self, m: int, up: protocol.Upload) -> protocol.Upload:
    """The upload as an armed corrupt/poison fault of learner m leaves it."""
    f = next((f for f in self._taints[m] if f.kind == "poison" or f.mode == "up"), None)
    if f is None:
      return up
    self._taints[m].remove(f)
    if f.kind == "poison":  # at the source: the checksum is computed over the poison
      up = dataclasses.replace(up, delta=chaos.poison(up.delta, f.mode, f.factor), checksum=None)
    else:  # in transit: after the checksum
      up = dataclasses.replace(up, delta=chaos.flip_bits(up.delta, self.rng))
    self._count_taint(f, m)
    self.taints.sent_up(up, f"{f.kind}_{f.mode}")
    return up

  def _count_taint(self, f: chaos.Fault, m: int) -> None:
    self.stats.faults[f.kind] += 1
    self._log({"event": "fault", "kind": f.kind, "learner": m, "fault": f.describe()})

  def _send_down(self, send: protocol.Send) -> None:
    m = send.learner
    if not self.up[m]:
      self.stats.dropped["down"] += 1
      return
    arrival, _ = self._link(m, send.nbytes)
    if arrival is None:
      self.stats.dropped["down"] += 1
      return
    taint = next((f for f in self._taints[m] if f.kind == "corrupt" and f.mode == "down"), None)
    if taint is not None:
      self._taints[m].remove(taint)
      payload = chaos.flip_bits(send.update if send.update is not None else send.values, self.rng)
      send = dataclasses.replace(
          send, **{"update" if send.update is not None else "values": payload}
      )
      self._count_taint(taint, m)
      self.taints.sent_down(send, "corrupt_down")
    self.bytes_down[m] += send.nbytes
    self._push(arrival, AT_LEARNER, "at_learner", send, owner=m)

  def _on_at_sync(self, event: protocol.Event) -> None:
    self._handle(event)

  def _on_timer(self, _) -> None:
    self._handle(protocol.Tick(self.now))

  def _on_reject(self, refused: protocol.Refused) -> None:
    super()._on_reject(refused)
    m, p, code = refused.learner, refused.fragment, refused.code
    if not self.up[m] or refused.sent_time is None:
      return
    # A Join sent with or after the upload already reported the versions it was based on.
    if code in RESYNC_CODES and refused.sent_time > self._last_join[m]:
      self._resync(m)
    # Told of it one latency later, the learner sends the fragment again (once).
    if code in RESEND_CODES and (m, p, refused.sent_time) not in self._resends:
      base = (refused.base_generation, refused.base_version)
      self._push(self.now + self.net.latency_s, AT_LEARNER, "resend", (m, p, base), owner=m)
