"""The loop of one learner in real time, over any link (in-process or gRPC).

`run_learner` trains one learner continuously: it joins, takes steps, uploads due fragments,
applies what arrives, keeps training while the synchronizer is unreachable and rejoins with
exponential backoff. A (re)started process joins before its first step: one restored from a
checkpoint holds every fragment and could train at once, but the synchronizer refuses its join
until the killed process's session has been silent for `absent_after_s`, and a fast learner used
to finish every step in that window, unjoined, so none of its work was merged; it waits up to
`first_join_s` (8 heartbeats, twice the absence a session is held for), then trains anyway.

Nothing trained while the synchronizer is away is dropped: the uploads that fall due meanwhile
are decided and held, and the next Join sends every unanswered one again, computed afresh, before
anything that arrives can overwrite that progress (`LearnerMachine.joined_unseen`). A learner done
training waits up to `settle_timeout_s` for the run to settle; what is still unanswered then is
in its result (`undelivered_steps`) for its process to save and report.

A learner that spans several processes (rpc/multihost.py) may be changed other than by a step
only at its sync points (`at_sync_point`): there the loop joins, applies what arrived and decides
uploads; between two it only steps and sends, and a refusal that comes back meanwhile is handled
at the next one. A single-process learner is at a sync point after every step.
"""

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from diloco.outer import protocol
from diloco.outer.learner import learner_machine
from diloco.outer.sync import admission
from diloco.outer.learner.learner import Learner
from diloco.outer.outcomes import Code
from diloco.runtime import async_link
from diloco.runtime.link import Link, Refused, Unreachable


def run_learner(
    learner: Learner,
    link: Link,
    next_batch: Callable[[], dict],
    steps: int,
    *,
    overlap: int,
    blocking: bool,
    heartbeat_s: float = 0.5,
    stop: threading.Event | None = None,
    leave: threading.Event | None = None,
    on_step: Callable[..., None] | None = None,
    max_backoff_s: float = 4.0,
    settle_timeout_s: float = 60.0,
    seed: int = 0,
    first_join_s: float | None = None,
    rejoin=None,
) -> dict[str, Any]:
  """Trains `learner` to `steps` inner steps over `link`, then waits for the run to settle.

  A heartbeat thread reports progress every `heartbeat_s`, so a long step (or its compilation)
  does not get the learner marked absent. Blocking learners (synchronous modes) do not start step
  s+overlap+1 before the fragment sent at step s is back; non-blocking ones never wait.
  `rejoin` (a restarted process's, rpc/learner_rejoin.py) hears of every Join's answer and of
  every fragment applied. `leave` set ends training at the next sync point as if `steps` were
  reached: the learner then delivers what it holds and settles, as at its last step (`stop` ends
  it without delivering: a preemption).
  """
  loop = _LearnerLoop(
      learner, link, stop or threading.Event(), heartbeat_s, max_backoff_s, random.Random(seed)
  )
  if leave is not None:
    loop.leave = leave
  loop.first_join_s = 8 * heartbeat_s if first_join_s is None else first_join_s
  loop.rejoin = rejoin
  beating = threading.Event()

  def heartbeats() -> None:
    while not beating.wait(heartbeat_s):
      if loop.joined and time.monotonic() - loop.last_beat > heartbeat_s:
        loop.beat()

  beater = threading.Thread(target=heartbeats, daemon=True, name=f"beat{learner.index}")
  beater.start()
  try:
    loop.train(next_batch, steps, overlap, blocking, on_step)
    settled = loop.settle(settle_timeout_s)
  finally:
    beating.set()
    beater.join()
  return {
      "steps": learner.steps,
      "tokens": learner.tokens,
      "settled": settled,
      "joins": loop.joins,
      "unreachable_steps": loop.unreachable_steps,
      "applied": loop.applied,
      "dropped": loop.dropped,
      "decisions": loop.machine.digest(),  # (learner_machine: comparable with the virtual's)
      # Fragment -> steps of progress whose upload was never answered (the synchronizer was
      # away until the settle timeout, or the learner was stopped): {} when all was delivered.
      "undelivered_steps": {str(p): n for p, n in loop.machine.undelivered().items()},
      # Steps of its uploads the synchronizer refused for good, by code (e.g. an outlier screen
      # rejecting the large delta of a long outage): answered, so not undelivered, but lost.
      "refused_steps": dict(sorted(loop.refused_steps.items())),
      # The longest a Join or an upload call held the training thread: up to a call's deadline
      # on a silent link, unless the link makes them in threads (async_link, gRPC learners).
      "longest_call_s": loop.longest_call_s,
  }


class _LearnerLoop:
  """The state of one learner's connection: joined or not, backoff, fragments in flight."""

  def __init__(
      self,
      learner: Learner,
      link: Link,
      stop: threading.Event,
      heartbeat_s: float,
      max_backoff_s: float,
      rng: random.Random,
  ):
    self.learner, self.link, self.stop, self.rng = learner, link, stop, rng
    self.heartbeat_s, self.max_backoff_s = heartbeat_s, max_backoff_s
    self.joined, self.retry_at, self.backoff, self.last_beat = False, 0.0, 0.1, 0.0
    self.joins = self.unreachable_steps = self.applied = self.dropped = 0
    # The protocol's decisions (blocking and overlap are set by `train`).
    self.machine = learner_machine.LearnerMachine(
        learner, len(learner.versions), blocking=False, overlap=0
    )
    self.first_join_s = 0.0  # how long the first step waits for the first join
    # Once trained, every heartbeat says finished: the beat thread's report must not follow the
    # settling loop's and say "not finished" of a learner that is. Beats go one at a time.
    self.trained, self._beat_lock = False, threading.Lock()
    self.outbox: list[protocol.Upload] = []  # decided on, not sent yet
    self.step_time = 0.0  # of the last step (what a resend reports for the grace window)
    self.refused_steps: dict[str, int] = {}  # refusal code -> steps of the uploads it refused
    self.deferred: list[Callable[[], None]] = []  # refusals met inside a run of steps
    self.rejoin = None  # told of each Join's answer and each fragment applied
    self.longest_call_s = 0.0  # the longest Join or upload call the loop made (`_timed`)
    self.leave = threading.Event()  # set: train no further, deliver and settle (`run_learner`)

  def at_sync(self) -> bool:
    """Whether the learner may be changed other than by a step now (see the module doc)."""
    return getattr(self.learner, "at_sync_point", True)

  def catch_up(self) -> None:
    """At a sync point: what was deferred since the last one, in order."""
    while self.deferred:
      self.deferred.pop(0)()

  def fail(self) -> None:
    """The link failed: join again after an exponential, jittered backoff."""
    self.joined = False
    self.retry_at = time.monotonic() + self.backoff * (0.5 + self.rng.random())
    self.backoff = min(2 * self.backoff, self.max_backoff_s)

  def ensure_joined(self) -> bool:
    if self.joined or time.monotonic() < self.retry_at:
      return self.joined
    # A link that joins in a thread (async_link) answers JOINING until its Join is answered:
    # the loop trains on meanwhile, unjoined, rather than wait out a silent host's deadline.
    join = getattr(self.link, "join_nowait", self.link.join)
    try:
      answer = self._timed(join, tuple(self.learner.versions), tuple(self.learner.generations))
    except (Unreachable, Refused):
      self.fail()
      return False
    if answer is async_link.JOINING:
      return False
    self._take_returned()  # (uploads of before the Join: a late refusal, or never sent)
    self.joined, self.backoff, self.last_beat = True, 0.1, time.monotonic()
    self.joins += 1
    # Sends of an older synchronizer generation still buffered (fetched before it restarted)
    # are stale from now on: the Join's answer holds what they held (`LearnerMachine.joined`).
    self.machine.joined(getattr(answer, "generation", None))
    if self.rejoin is not None:  # (at a sync point: a restart may move its step counter)
      self.rejoin.joined(answer)
    self.machine.join_sent(self.last_beat)
    unanswered = set(self.machine.inflight)
    if getattr(self.learner, "delivery", "replace") == "rebase":
      # The Join's answer first (the host queued it before the Join returned): it may name an
      # unanswered upload as merged (`Send.own`), whose copy computed afresh on a newer base
      # would be merged again; and under rebase an arrival never drops progress.
      self.deliver(0.0)
      if not self.joined:
        return False
    # What it holds unanswered goes now, before a merge can arrive and overwrite it (after a
    # resync too: some of it may never have left), with what it trained after an upload the
    # answer named as merged.
    answered = unanswered - set(self.machine.inflight)
    self._decide(self.machine.joined_unseen(answered))
    self._send(self.outbox)
    return self.joined  # (the sending may have found it gone again)

  def deliver(self, wait_s: float) -> None:
    self._take_returned()
    try:
      sends = self.link.poll(wait_s)
    except (Unreachable, Refused):
      self.fail()
      return
    take_refused = getattr(self.link, "take_refused", None)  # a link that uploads in a thread
    for p in take_refused() if take_refused is not None else ():
      self.machine.unsent(p)
    for s in sends:
      if isinstance(s, protocol.Refused):  # refused when its round merged, after the upload
        self._at_sync(lambda s=s: self._refused_late(s))
      else:
        self._decide(self.machine.arrived(s))

  def _take_returned(self) -> None:
    """A link that uploads in a thread hands back what no answer will come for: as the caller's
    `_send` would have found them, refused or never sent."""
    take = getattr(self.link, "take_returned", None)
    for up, err in take() if take is not None else ():
      if err is None:
        self._at_sync(lambda up=up: self.learner.not_merged(up.fragment, up.sent_time))
      else:
        self._at_sync(lambda up=up, err=err: self._refused(up, err))

  def _decide(self, decisions: list) -> None:
    """Carries out the machine's decisions: apply, drop, join again, send again."""
    for d in decisions:
      if isinstance(d, learner_machine.Apply):
        self.learner.receive(d.send, rebase=d.rebase)
        self.applied += 1
        if self.rejoin is not None:
          self.rejoin.received()
      elif isinstance(d, learner_machine.Drop):
        self.dropped += d.code is not Code.GAP
      elif isinstance(d, learner_machine.Rejoin):
        self.joined = False  # messages were lost, or the base refused: join again
      elif isinstance(d, learner_machine.Resend):
        now = time.monotonic()
        for up in self.machine.resend_due(d.fragment, d.base, now, as_sent=d.as_sent):
          copy = self.learner.sent_again(up.fragment, now) if d.as_sent else None
          self.outbox.append(copy or self._upload(up.fragment, self.step_time))

  def beat(self, finished: bool = False) -> bool:
    """A heartbeat; returns whether the run is settled. The learner reports itself finished only
    with nothing unanswered: an upload still in flight (a rebase's progress sent after its last
    merge arrived) may merge into a version the others must still receive, so they must not be
    told the run is settled and leave before it."""
    done = (finished or self.trained) and not self.machine.inflight
    try:
      with self._beat_lock:
        settled = self.link.progress(done)
    except (Unreachable, Refused):
      self.fail()
      return False
    self.last_beat = time.monotonic()
    return settled

  def train(self, next_batch, steps: int, overlap: int, blocking: bool, on_step) -> None:
    """Steps until `steps`; uploads what the schedule says after each step.

    A non-blocking learner sends the uploads due after step t while step t+1 runs (JAX
    dispatches a step and returns), so the round trip overlaps the computation instead of
    idling it; the answer comes within the overlap tau the schedule already allows. Over a
    link that sends in a thread (a gRPC learner's) the send only queues the upload, and a
    fragment whose last upload is unanswered is not sent again, so a slow link makes uploads
    late and larger, never steps slower (runtime/async_link.py). Over the caller's-thread link
    the round trip bounds how far it runs ahead: a learner whose steps are shorter than it
    waits for it at its next send. A blocking learner sends at once: it waits for the answers
    anyway.
    """
    learner, last, outbox = self.learner, time.monotonic(), self.outbox
    self.machine.blocking, self.machine.overlap = blocking, overlap
    if 0 < steps <= learner.steps:  # restored at its end: deliver what its checkpoint holds
      self.machine.holding()
    first_join_by = last + self.first_join_s
    ending = lambda: (self.stop.is_set() or self.leave.is_set()) and self.at_sync()
    while learner.steps < steps and not ending():
      if self.at_sync():  # (inside a run of steps nothing changed what is decided here)
        self.catch_up()
        if self.ensure_joined():
          self.deliver(0.0)
        holds_all = all(v >= 0 for v in learner.versions)
        waiting = self.machine.blocked()
        unjoined = not self.joins and time.monotonic() < first_join_by  # see the module doc
        if not holds_all or waiting or unjoined:
          # What a delivery decided to send again (a rebase's progress, after a refusal) goes
          # now: the machine counts it as unanswered, so a blocking learner waits for its answer
          # and would otherwise never reach the next step's send (a lockstep round waited for
          # it while it waited for the round: the run deadlocked).
          self._send(outbox)
          if self.joined:
            self.deliver(min(self.heartbeat_s, 0.5))
          else:
            time.sleep(0.05)
          last = time.monotonic()
          continue
      metrics = learner.step(next_batch())  # dispatched; runs while the outbox goes
      self._send(outbox)
      if on_step is not None:
        on_step(learner, metrics)
      now = time.monotonic()
      self.step_time, last = now - last, now
      if self.at_sync():  # (a run of steps just ended: its refusals before its uploads)
        self.catch_up()
      if not self.joined:  # decided, and held: the next Join sends them, computed afresh
        self.unreachable_steps += 1
        self.machine.stepped(learner.due())
        continue
      for d in self.machine.stepped(learner.due()):  # (not one whose last is unanswered)
        outbox.append(self._upload(d.fragment, self.step_time))
      if blocking:
        self._send(outbox)
    self._send(outbox)
    self.catch_up()  # (the loop ends at a sync point)
    self.trained = learner.steps >= steps or self.leave.is_set()

  def _upload(self, p: int, step_time: float) -> protocol.Upload:
    sent = time.monotonic()  # (the host stamps its own times; this one orders it after Joins)
    return self.learner.upload(p, sent_time=sent, arrival_time=0.0, step_time=step_time)

  def _send(self, outbox: list) -> None:
    """Uploads and empties `outbox`; a refused upload goes to the machine (no answer will
    come; it may say to join again or to send it again)."""
    while outbox and self.joined:
      up = outbox.pop(0)
      try:
        self._timed(self.link.upload, up)
      except Refused as err:
        self._at_sync(lambda up=up, err=err: self._refused(up, err))
      except Unreachable:  # (it may have arrived: a rebase may take it as merged)
        self.fail()
    for up in outbox:  # never sent: unanswered in the machine, the next Join sends them afresh
      self._at_sync(lambda up=up: self.learner.not_merged(up.fragment, up.sent_time))
    outbox.clear()

  def _timed(self, call, *args):
    """A Join or upload call, its time kept if it is the longest so far (`longest_call_s`:
    what the network held the training thread for, at most, in one call)."""
    t0 = time.monotonic()
    try:
      return call(*args)
    finally:
      self.longest_call_s = max(self.longest_call_s, time.monotonic() - t0)

  def _at_sync(self, change: Callable[[], None]) -> None:
    """Changes the learner now at a sync point, else at the next one."""
    if self.at_sync():
      change()
    else:
      self.deferred.append(change)

  def _refused(self, up: protocol.Upload, err: Refused) -> None:
    refusal = admission.refusal(up.learner, up.fragment, up.sent_time, str(err), err.code, up)
    self.learner.not_merged(up.fragment, up.sent_time)
    if err.code not in learner_machine.RESYNC:  # (those are sent again, or were merged)
      code = str(err.code.value)
      self.refused_steps[code] = self.refused_steps.get(code, 0) + up.steps
    self._decide(self.machine.refused(refusal))

  def _refused_late(self, refusal: protocol.Refused) -> None:
    """An upload answered on arrival and refused when its round merged (the screen, a
    non-finite merge): nothing will come back for it; the machine decides what goes again."""
    if refusal.sent_time is not None:
      self.learner.not_merged(refusal.fragment, refusal.sent_time)
    self._decide(self.machine.refused(refusal))

  def settle(self, timeout_s: float) -> bool:
    """Keeps polling until every learner finished and every merge arrived (or timeout)."""
    deadline = time.monotonic() + timeout_s
    while not self.stop.is_set() and time.monotonic() < deadline:
      if not self.ensure_joined():
        time.sleep(0.05)
        continue
      self.catch_up()
      self.deliver(0.2)
      self._send(self.outbox)  # (uploads sent again on the machine's word)
      if self.beat(finished=True) and not self.machine.inflight:
        self.deliver(0.0)
        return True
    return False
