"""The virtual runtime: a deterministic discrete-event loop on a simulated clock.

Learners take real JAX steps; only time is simulated. A step of learner m lasts
`sim.step_s · speed_m · (batch_m / batch) · exp(N(0, sim.step_jitter))` simulated seconds, drawn
from a seeded generator; a message of n bytes takes `sim.latency_s + 8n / (sim.bandwidth_gbps·1e9)`
on its link. Events at the same instant run in a fixed order (arrivals at the synchronizer, timers,
arrivals at learners, then step starts), each kind in the order it was scheduled, so the same seed
gives the same bits. The run stops when the learners have used the token budget
(`steps · Σ_m batch_m · seq_len`), or no step may start any more (`sim.time_limit_s`), and every
message in flight has been delivered.

Blocking learners (synchronous and Streaming DiLoCo) do not start step s+τ+1 before the fragment
they sent at step s has come back; non-blocking learners (Decoupled DiLoCo) never wait.

Every event has an owner (learner m or the synchronizer) and is dropped unchanged if its owner's
epoch moved on before it happened (it was addressed to a process that crashed since); background
events (faults) do not keep the run going by themselves. With a `recovery.Recovery`, learners and
the synchronizer save checkpoints as they go.

Faults are not the runtime's: it holds a fault component (`faults=`, a `virtual_hooks.Faults`; the
default acts on nothing) and calls it at the hook points that class names, each at one place: a
step's length and end, a message put on a link up or down, an arrival at a learner, the
synchronizer's handling of an event and its checkpoint action, a learner's (re)join, whether the
run goes on, its start and end. An event kind the runtime has no `_on_<kind>` handler for is the
fault component's (`on_<kind>`): the events it schedules itself. runtime/virtual_chaos.py's
`Chaos` is the fault schedule's component.
"""

import dataclasses
import heapq
import itertools
import math
from typing import Any, Callable

import numpy as np

from diloco.outer import protocol
from diloco.outer.learner import learner_machine
from diloco.outer.learner.learner import Learner
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.runtime import virtual_hooks
from diloco.watch import timeline

# Same-time ordering of event kinds (lower first); faults happen before anything else.
FAULT, AT_SYNC, TIMER, AT_LEARNER, STEP_DONE, START = range(-1, 5)
SYNC = "sync"  # owner of the synchronizer's events; learner m's events are owned by m


@dataclasses.dataclass
class LearnerClock:
  """Simulated-time bookkeeping of one learner."""

  step_s: float  # mean seconds per step
  rng: np.random.Generator
  jitter: float
  start_s: float = 0.0
  stop_s: float = 0.0  # > 0: it starts no step at or after this time, and leaves
  busy_s: float = 0.0
  idle_s: float = 0.0
  wasted_s: float = 0.0  # busy time whose work a crash lost
  waiting_since: float | None = None
  done: bool = False
  joined: bool = True  # False: it starts late and joins the synchronizer when it starts

  def duration(self) -> float:
    if self.jitter <= 0:
      return self.step_s
    return self.step_s * math.exp(self.jitter * self.rng.standard_normal())


@dataclasses.dataclass(frozen=True)
class Network:
  latency_s: float
  bandwidth_gbps: float

  def delay(self, nbytes: int) -> float:
    return self.latency_s + 8.0 * nbytes / (self.bandwidth_gbps * 1e9)


class VirtualRuntime:
  """Drives learners and one synchronizer through simulated time; faults act through `faults`."""

  def __init__(
      self,
      learners: list[Learner],
      sync: Synchronizer,
      clocks: list[LearnerClock],
      network: Network,
      next_batch: Callable[[int], dict],
      token_budget: int,
      overlap: int,
      blocking: bool,
      on_step: Callable,
      on_log: Callable,
      recovery: Any = None,
      stop: Callable[[], str | None] | None = None,
      time_limit_s: float = 0.0,
      faults: virtual_hooks.Faults | None = None,
  ):
    self.learners, self.sync, self.clocks, self.net = learners, sync, clocks, network
    self.machines = [  # each learner's protocol decisions (outer/learner/learner_machine.py)
        learner_machine.LearnerMachine(
            l_, l_.frag.num_fragments, blocking=blocking, overlap=overlap
        )
        for l_ in learners
    ]
    self.next_batch, self.budget = next_batch, token_budget
    self.time_limit_s = time_limit_s  # > 0: no step starts at or after it (equal-time runs)
    self.overlap, self.blocking = overlap, blocking
    self.on_step, self.on_log = on_step, on_log
    self.recovery = recovery  # a recovery.Recovery, or None: no checkpoints
    self.stop = stop  # polled after every event: why to stop there (runtime/preemption.py)
    self.stopped_by: str | None = None
    self.started = False  # the learners' first steps are scheduled (a resumed run's are)
    self.now = 0.0
    self.tokens_started = 0
    self.bytes_up = [0] * len(learners)
    self.bytes_down = [0] * len(learners)
    self.queue: list[tuple] = []
    self._seq = itertools.count()
    self.epochs: dict[Any, int] = {SYNC: 0, **{m: 0 for m in range(len(learners))}}
    self._background = 0  # background events in the queue
    self.trace = timeline.Trace(len(learners))  # what each learner did when (timeline.png)
    self.faults = faults if faults is not None else virtual_hooks.Faults()
    self.faults.bind(self)

  def push(
      self,
      time: float,
      order: int,
      kind: str,
      payload: Any,
      owner: Any = None,
      background: bool = False,
  ) -> None:
    """Schedules an event of `kind` at `time` (`order` ranks same-time kinds), dropped if its
    `owner` has crashed since; a `background` one does not keep the run going by itself."""
    epoch = self.epochs[owner] if owner is not None else None
    self._background += background
    heapq.heappush(
        self.queue, (time, order, next(self._seq), kind, payload, owner, epoch, background)
    )

  def _more(self) -> bool:
    """Whether the run goes on: some event other than a background one is due, or the faults
    say so."""
    return len(self.queue) > self._background or self.faults.goes_on()

  def run(self) -> float:
    """Runs to the end of the token budget, or until `stop` says why to stop at an event
    boundary (`stopped_by`; the queue then holds what is still to happen); returns the
    simulated time."""
    if not self.started:
      self.started = True
      self.faults.start()
      if self.recovery is not None:
        self.recovery.save_sync(self.sync, force=True)  # a restart always finds a checkpoint
      for m, clock in enumerate(self.clocks):
        self.push(clock.start_s, START, "start", m, owner=m)
    while self._more():
      time, _, _, kind, payload, owner, epoch, background = heapq.heappop(self.queue)
      self._background -= background
      if owner is not None and self.epochs[owner] != epoch:
        continue  # addressed to a process that crashed since
      self.now = time
      handler = getattr(self, "_on_" + kind, None) or getattr(self.faults, "on_" + kind)
      handler(payload)
      reason = self.stop() if self.stop is not None else None
      if reason is not None and self._more():  # (nothing left to do: finished, not stopped)
        self.stopped_by = reason
        break
    return self.now

  # ---- learner side ----

  def _on_start(self, m: int) -> None:
    clock, learner = self.clocks[m], self.learners[m]
    if clock.done:
      return
    if not clock.joined:  # a late start (sim.start_times): it joins now, trains once answered
      clock.joined = True
      return self.decide(m, self.machines[m].restored())
    if 0 < clock.stop_s <= self.now:  # its stretch is over (sim.stop_times): it leaves
      self.stop_waiting(m)
      clock.done = True
      self._send_up(m, protocol.Leave(m, self.now))
      return
    if self.machines[m].blocked():
      if clock.waiting_since is None:
        clock.waiting_since = self.now
      return  # resumed by the arrival it waits for
    self.stop_waiting(m)
    over_time = 0 < self.time_limit_s <= self.now
    if over_time or self.tokens_started + learner.tokens_per_step > self.budget:
      clock.done = True
      return
    self.tokens_started += learner.tokens_per_step
    metrics = learner.step(self.next_batch(m))
    duration = self.faults.duration(m, clock.duration())
    clock.busy_s += duration
    self.trace.span(m, timeline.TRAIN, self.now, self.now + duration)
    self.push(self.now + duration, STEP_DONE, "step_done", (m, metrics, duration), owner=m)

  def stop_waiting(self, m: int) -> None:
    """Learner m waits no longer (if it did): its idle time and the timeline's wait span."""
    clock = self.clocks[m]
    if clock.waiting_since is not None:
      clock.idle_s += self.now - clock.waiting_since
      self.trace.span(m, timeline.WAIT, clock.waiting_since, self.now)
      clock.waiting_since = None

  def _on_step_done(self, payload) -> None:
    m, metrics, duration = payload
    learner = self.learners[m]
    self.on_step(m, learner, metrics, self.now)
    for d in self.machines[m].stepped(learner.due()):
      up = learner.upload(d.fragment, sent_time=self.now, arrival_time=0.0, step_time=duration)
      self._send_up(m, up)
    saved = self.recovery is not None and self.recovery.after_step(learner)  # if due
    self.faults.stepped(m, duration, saved)
    self.push(self.now, START, "start", m, owner=m)

  def _send_up(self, m: int, message: virtual_hooks.Message) -> None:
    """Puts learner m's message on its link to the synchronizer."""
    is_upload = isinstance(message, protocol.Upload)
    sent = self.faults.send_up(m, message, self.net.delay(message.nbytes if is_upload else 0))
    if sent is None:
      return
    arrival, message = sent
    self.bytes_up[m] += message.nbytes if is_upload else 0
    self.push(arrival, AT_SYNC, "at_sync", dataclasses.replace(message, time=arrival), owner=SYNC)

  def _on_at_learner(self, send: protocol.Send) -> None:
    decisions = self.machines[send.learner].arrived(send)
    self.faults.arrived(send, decisions)
    self.decide(send.learner, decisions)

  def decide(self, m: int, decisions: list) -> None:
    """Carries out learner m's decisions (learner_machine), in order."""
    for d in decisions:
      getattr(self, "_do_" + type(d).__name__.lower())(m, d)

  def _wake(self, m: int) -> None:
    """A waiting learner m tries to start its next step (it may still be blocked)."""
    if self.clocks[m].waiting_since is not None:
      self.push(self.now, START, "start", m, owner=m)

  def _do_apply(self, m: int, d: learner_machine.Apply) -> None:
    self.learners[m].receive(d.send, rebase=d.rebase)
    self._wake(m)

  def _do_rejoined(self, m: int, d: learner_machine.Rejoined) -> None:
    """Learner m (started late, or back from a crash) holds the global fragments its Join was
    answered with: it trains from now on."""
    del d
    if self.faults.rejoined(m):
      self.push(self.now, START, "start", m, owner=m)

  def _do_drop(self, m: int, d: learner_machine.Drop) -> None:
    del m, d  # (counted by the faults, `Faults.arrived`)

  # ---- synchronizer side ----

  def _on_at_sync(self, event: protocol.Event) -> None:
    self.faults.handle(event)

  def handle(self, event: protocol.Event) -> None:
    """The synchronizer consumes `event`; its actions are carried out, then a Join's answer is
    read by its learner."""
    actions = self.sync.handle(event)
    self.act(actions)
    if isinstance(event, protocol.Join):
      self.decide(event.learner, self.join_answered(event.learner, actions))

  def join_answered(self, m: int, actions: list[protocol.Action]) -> list:
    """Learner m's machine learns which fragments answer its Join."""
    sends = {a.fragment for a in actions if isinstance(a, protocol.Send) and a.learner == m}
    return self.machines[m].join_answered(sends)

  def _on_timer(self, _) -> None:
    self.faults.handle(protocol.Tick(self.now))

  def act(self, actions: list[protocol.Action]) -> None:
    """Carries out the synchronizer's actions, in order."""
    for a in actions:
      if isinstance(a, protocol.Send):
        self._send_down(a)
      elif isinstance(a, protocol.SetTimer):
        self.push(a.time, TIMER, "timer", None, owner=SYNC)
      elif isinstance(a, protocol.Checkpoint):
        self._checkpoint(a)
        if self.sync is None:
          return  # it crashed saving (a fault): the rest of its actions died with it
      elif isinstance(a, protocol.Log):
        self.on_log(a.record)
      elif isinstance(a, protocol.Refused):
        self.on_log(a.record)
        self._on_reject(a)

  def _send_down(self, send: protocol.Send) -> None:
    """Puts a Send on the synchronizer's link to its learner."""
    sent = self.faults.send_down(send, self.net.delay(send.nbytes))
    if sent is None:
      return
    arrival, send = sent
    self.bytes_down[send.learner] += send.nbytes
    self.push(arrival, AT_LEARNER, "at_learner", send, owner=send.learner)

  def _on_reject(self, refused: protocol.Refused) -> None:
    """Nothing will come back for a rejected upload: a learner waiting for it goes on (and
    re-joins or sends again where its machine says so)."""
    m = refused.learner
    if not self.faults.learner_up(m):
      return  # (a crashed learner's machine learns nothing)
    self.learners[m].not_merged(refused.fragment, refused.sent_time)
    decisions = self.machines[m].refused(refused)
    self._wake(m)
    self.decide(m, decisions)

  def _do_rejoin(self, m: int, d: learner_machine.Rejoin) -> None:
    """Learner m joins again with the versions it holds (at most one Join in flight), unless
    the faults hold it back."""
    if self.faults.rejoins(m, d.why) and not self.machines[m].join_inflight:
      self.join(m)

  def join(self, m: int) -> None:
    """Learner m sends a Join with the versions it holds."""
    learner = self.learners[m]
    self.machines[m].join_sent(self.now)
    self._send_up(
        m, protocol.Join(m, self.now, tuple(learner.versions), tuple(learner.generations))
    )

  def _do_resend(self, m: int, d: learner_machine.Resend) -> None:
    """Told of the refusal one latency later (at once after a synchronizer restart), the
    learner sends the fragment again if its machine still wants it."""
    if d.base is None:
      return self.resend(m, d.fragment, None)
    self.push(self.now + self.net.latency_s, AT_LEARNER, "resend", (m, d.fragment, d.base), owner=m)

  def _on_resend(self, payload: tuple[int, int, tuple]) -> None:
    self.resend(*payload)

  def resend(self, m: int, p: int, base: tuple[int, int] | None) -> None:
    """Learner m sends fragment p again, computed afresh, if its machine still wants it."""
    machine, learner = self.machines[m], self.learners[m]
    waited = p in machine.inflight
    for d in machine.resend_due(p, base, self.now):
      self._send_up(
          m, learner.upload(d.fragment, self.now, arrival_time=0.0, step_time=self.clocks[m].step_s)
      )
      return
    if waited:
      self._wake(m)

  def _checkpoint(self, action: protocol.Checkpoint) -> None:
    if not self.faults.checkpoint(action) and self.recovery is not None:
      self.recovery.save_sync(self.sync)

  def finish(self) -> None:
    """Ends the faults; counts the idle time of learners still waiting at the end; saves the
    synchronizer."""
    self.faults.finish()
    for m in range(len(self.clocks)):
      self.stop_waiting(m)
    if self.recovery is not None and self.sync is not None:
      self.recovery.save_sync(self.sync, force=True)
