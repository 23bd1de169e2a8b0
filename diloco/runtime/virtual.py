"""The virtual runtime: a deterministic discrete-event loop on a simulated clock.

Learners take real JAX steps; only time is simulated. A step of learner m lasts
`sim.step_s · speed_m · (batch_m / batch) · exp(N(0, sim.step_jitter))` simulated seconds, drawn
from a seeded generator; a message of n bytes takes `sim.latency_s + 8n / (sim.bandwidth_gbps·1e9)`
on its link. Events at the same instant run in a fixed order (arrivals at the synchronizer, timers,
arrivals at learners, then step starts), each kind in the order it was scheduled, so the same seed
gives the same bits. The run stops when the learners have used the token budget
(`steps · Σ_m batch_m · seq_len`) and every message in flight has been delivered.

Blocking learners (synchronous and Streaming DiLoCo) do not start step s+τ+1 before the fragment
they sent at step s has come back; non-blocking learners (Decoupled DiLoCo) never wait.
"""

import dataclasses
import heapq
import itertools
import math
from typing import Any, Callable

import numpy as np

from diloco import protocol
from diloco.learner import Learner
from diloco.synchronizer import Synchronizer

# Same-time ordering of event kinds (lower first).
AT_SYNC, TIMER, AT_LEARNER, STEP_DONE, START = range(5)


@dataclasses.dataclass
class LearnerClock:
    """Simulated-time bookkeeping of one learner."""

    step_s: float  # mean seconds per step
    rng: np.random.Generator
    jitter: float
    start_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    waiting_since: float | None = None
    done: bool = False
    inflight: dict[int, int] = dataclasses.field(default_factory=dict)  # fragment -> step sent

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
    """Drives learners and one synchronizer through simulated time."""

    def __init__(self, learners: list[Learner], sync: Synchronizer, clocks: list[LearnerClock],
                 network: Network, next_batch: Callable[[int], dict], token_budget: int,
                 overlap: int, blocking: bool, on_step: Callable, on_log: Callable):
        self.learners, self.sync, self.clocks, self.net = learners, sync, clocks, network
        self.next_batch, self.budget = next_batch, token_budget
        self.overlap, self.blocking = overlap, blocking
        self.on_step, self.on_log = on_step, on_log
        self.now = 0.0
        self.tokens_started = 0
        self.bytes_up = [0] * len(learners)
        self.bytes_down = [0] * len(learners)
        self._queue: list[tuple[float, int, int, str, Any]] = []
        self._seq = itertools.count()

    def _push(self, time: float, order: int, kind: str, payload: Any) -> None:
        heapq.heappush(self._queue, (time, order, next(self._seq), kind, payload))

    def run(self) -> float:
        """Runs to the end of the token budget; returns the simulated time."""
        for m, clock in enumerate(self.clocks):
            self._push(clock.start_s, START, "start", m)
        while self._queue:
            time, _, _, kind, payload = heapq.heappop(self._queue)
            self.now = time
            getattr(self, "_on_" + kind)(payload)
        return self.now

    # ---- learner side ----

    def _on_start(self, m: int) -> None:
        clock, learner = self.clocks[m], self.learners[m]
        if clock.done:
            return
        if self.blocking and any(learner.steps >= s + self.overlap for s in clock.inflight.values()):
            if clock.waiting_since is None:
                clock.waiting_since = self.now
            return  # resumed by the arrival it waits for
        if clock.waiting_since is not None:
            clock.idle_s += self.now - clock.waiting_since
            clock.waiting_since = None
        if self.tokens_started + learner.tokens_per_step > self.budget:
            clock.done = True
            return
        self.tokens_started += learner.tokens_per_step
        metrics = learner.step(self.next_batch(m))
        duration = clock.duration()
        clock.busy_s += duration
        self._push(self.now + duration, STEP_DONE, "step_done", (m, metrics, duration))

    def _on_step_done(self, payload) -> None:
        m, metrics, duration = payload
        learner, clock = self.learners[m], self.clocks[m]
        self.on_step(m, learner, metrics, self.now)
        for p in learner.due():
            up = learner.upload(p, sent_time=self.now, arrival_time=0.0, step_time=duration)
            arrival = self.now + self.net.delay(up.nbytes)
            self.bytes_up[m] += up.nbytes
            clock.inflight[p] = learner.steps
            self._push(arrival, AT_SYNC, "at_sync", dataclasses.replace(up, time=arrival))
        self._push(self.now, START, "start", m)

    def _on_at_learner(self, send: protocol.Send) -> None:
        m = send.learner
        self.learners[m].receive(send)
        self.clocks[m].inflight.pop(send.fragment, None)
        if self.clocks[m].waiting_since is not None:
            self._push(self.now, START, "start", m)

    # ---- synchronizer side ----

    def _on_at_sync(self, up: protocol.Upload) -> None:
        self._act(self.sync.handle(up))

    def _on_timer(self, _) -> None:
        self._act(self.sync.handle(protocol.Tick(self.now)))

    def _act(self, actions: list[protocol.Action]) -> None:
        for a in actions:
            if isinstance(a, protocol.Send):
                self.bytes_down[a.learner] += a.nbytes
                self._push(self.now + self.net.delay(a.nbytes), AT_LEARNER, "at_learner", a)
            elif isinstance(a, protocol.SetTimer):
                self._push(a.time, TIMER, "timer", None)
            elif isinstance(a, protocol.Log):
                self.on_log(a.record)
                if a.record["event"] == "reject":  # nothing will come back for it
                    m, p = a.record["learner"], a.record["fragment"]
                    self.clocks[m].inflight.pop(p, None)
                    if self.clocks[m].waiting_since is not None:
                        self._push(self.now, START, "start", m)

    def finish(self) -> None:
        """Counts the idle time of learners still waiting at the end."""
        for clock in self.clocks:
            if clock.waiting_since is not None:
                clock.idle_s += self.now - clock.waiting_since
                clock.waiting_since = None
