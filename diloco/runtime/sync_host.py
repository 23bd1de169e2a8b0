"""The real-time host of one synchronizer state machine, shared by the threads and gRPC runtimes.

`SyncHost` owns one `Synchronizer` (the sans-I/O state machine) and serializes every event into it
under one lock, because callers (learner threads, gRPC worker threads, the timer thread) run
concurrently. It adds what a real deployment needs around the state machine: sessions (a learner id
is held by one live process at a time), heartbeats (a learner silent for `absent_after_s` becomes a
`Leave` and is left out of quorums until it joins again), a per-learner outbox of numbered sends
that learners long-poll and acknowledge, real timers for the grace window, a progress rate limit
and a cap on registered learners. A Join's answer (`link.Joined`) also carries the
synchronizer's versions, the other live learners' steps as their heartbeats last reported them
and this learner id's earlier process's last report: where a restarted learner process resumes
(rpc/learner_rejoin.py). The host's own refusals raise `link.Refused(code, message)`
before anything reaches the synchronizer, so they leave its state unchanged; an upload the
synchronizer refuses on arrival raises its `outcomes.Code`, whatever else it set off.
"""

import collections
import contextlib
import dataclasses
import heapq
import threading
import time
from collections.abc import Callable

from diloco.outer import protocol
from diloco.outer.outcomes import Code
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.recovery.crash_machine import Peer
from diloco.runtime.link import Joined, Refused


def answer(actions: list[protocol.Action], up: protocol.Upload) -> protocol.Refused | None:
  """The synchronizer's refusal of `up` among the actions its arrival set off, if it refused
  it: on arrival, or in a round its arrival let merge (a peer's round it unblocked, or its own
  with a quorum of one). The caller's answer, whatever else happened. (A round that merges
  later refuses it later, and only the logs and the status page say so.)"""
  for a in actions:
    if isinstance(a, protocol.Refused) and (a.learner, a.fragment, a.sent_time) == (
        up.learner,
        up.fragment,
        up.sent_time,
    ):
      return a
  return None


class SyncHost:
  """Thread-safe real-time host of one synchronizer state machine."""

  def __init__(
      self,
      sync: Synchronizer,
      *,
      absent_after_s: float = 5.0,
      max_learners: int = 64,
      progress_per_s: float = 50.0,
      on_log: Callable[[dict], None] = lambda r: None,
      on_checkpoint: Callable[[Synchronizer], None] = lambda s: None,
      on_progress: Callable[[int, dict], None] = lambda m, report: None,
      on_upload: Callable[[int, str, int], None] = lambda m, session, step: None,
      clock: Callable[[], float] = time.monotonic,
  ):
    self.sync, self.absent_after_s, self.max_learners = sync, absent_after_s, max_learners
    self.progress_per_s = progress_per_s
    self.on_log, self.on_checkpoint, self.clock = on_log, on_checkpoint, clock
    self.on_progress = on_progress  # what a heartbeat reports (the status page), under the lock
    self.on_upload = on_upload  # (learner, session, its step) of each upload, under the lock
    self.t0 = clock()
    self.cond = threading.Condition()
    self.sessions: dict[int, str] = {}
    self.last_seen: dict[int, float] = {}  # learner -> when any call of its session was last heard
    # (learner, session) -> its calls being served now, under a lock of their own (`_serving`).
    self.serving: collections.Counter = collections.Counter()
    self._serving_lock = threading.Lock()
    # learner -> when it was declared absent, until it joins again (the status page)
    self.absent_since: dict[int, float] = {}
    self.reported: dict[int, tuple[str, Peer]] = {}  # learner -> (session, its last report)
    self.finished: set[int] = set()
    # Told the run is settled and silent since (`settled`): gone, as far as sends go.
    self.released: set[int] = set()
    # Sends, and refusals made at merge time (a round merged after its upload was answered).
    self.outbox: dict[int, list[tuple[int, protocol.Send | protocol.Refused]]] = {}
    # (learner, fragment) -> (the host's sent time of its last upload, the learner's own): a
    # refusal made later names the upload as its learner sent it.
    self.sent_as: dict[tuple[int, int], tuple[float, float | None]] = {}
    self.last_seq: dict[int, int] = {}
    self.buckets: dict[int, tuple[float, float]] = {}  # learner -> (tokens, last refill)
    self.timers: list[float] = []
    self.counts: dict[str, int] = {}
    self.merges = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._background, daemon=True, name="sync-timers")
    self._thread.start()

  def now(self) -> float:
    return self.clock() - self.t0

  def count(self, code: str) -> None:
    """Counts a refusal by its name (a Code's value, or the wire's finer name)."""
    with self.cond:  # (reentrant: callers may hold it)
      self.counts[str(code)] = self.counts.get(str(code), 0) + 1

  def _refuse(self, code: Code, message: str) -> Refused:
    self.count(code)
    self.on_log({"event": "refused", "code": code.value, "reason": message, "time": self.now()})
    return Refused(code, message)

  # ---- calls from learners ----

  def join(
      self, learner: int, session: str, versions: tuple[int, ...], generations: tuple[int, ...] = ()
  ) -> tuple[int, int, Joined]:
    """Registers (or re-registers) a learner; returns (generation, last sequence number, what
    else the answer says)."""
    with self.cond:
      if learner < 0:
        raise self._refuse(Code.INVALID, f"learner id must be >= 0, got {learner}")
      held = self.sessions.get(learner)
      if held is not None and held != session and learner in self.sync.live:
        raise self._refuse(
            Code.ALREADY_EXISTS,
            f"learner {learner} is held by a live "
            "process; retry after it has been silent for "
            f"{self.absent_after_s} s",
        )
      if held is None and len(self.sessions) >= self.max_learners:
        raise self._refuse(Code.TOO_MANY, f"{self.max_learners} learners registered already")
      num = self.sync.frag.num_fragments
      if len(versions) != num or (generations and len(generations) != num):
        raise self._refuse(
            Code.INVALID,
            f"join with {len(versions)} versions and "
            f"{len(generations)} generations, expected {num}",
        )
      previous = self._previous(learner, session)
      self.sessions[learner] = session
      self.last_seen[learner] = self.now()
      self.absent_since.pop(learner, None)
      self.outbox[learner] = []
      self.last_seq.setdefault(learner, 0)
      self.finished.discard(learner)
      self.released.discard(learner)
      self._act(
          self.sync.handle(protocol.Join(learner, self.now(), tuple(versions), tuple(generations)))
      )
      joined = Joined(tuple(self.sync.versions), self._peers(learner), *previous)
      return self.sync.generation, self.last_seq[learner] - len(self.outbox[learner]), joined

  def _previous(self, learner: int, session: str) -> tuple[Peer | None, float]:
    """The last report of an earlier process of `learner` and how long it has been silent."""
    held = self.sessions.get(learner)
    last = self.reported.get(learner)
    if held is None or held == session or last is None or last[0] != held:
      return None, 0.0
    return last[1], self.now() - self.last_seen[learner]

  def _peers(self, learner: int) -> tuple[Peer, ...]:
    """The other live learners' last reports, from their current processes."""
    return tuple(
        peer
        for m, (session, peer) in sorted(self.reported.items())
        if m != learner and m in self.sync.live and self.sessions.get(m) == session
    )

  def _check_session(self, learner: int, session: str) -> None:
    if self.sessions.get(learner) != session or learner not in self.sync.live:
      raise self._refuse(Code.NOT_JOINED, f"learner {learner} has no live session here; join again")
    self.last_seen[learner] = self.now()

  def progress(
      self, learner: int, session: str, finished: bool = False, report: dict | None = None
  ) -> bool:
    """A heartbeat (with what the learner `report`s of itself, if anything); returns whether
    the run is settled (see `settled`)."""
    with self._serving(learner, session), self.cond:
      self._check_session(learner, session)
      self.released.discard(learner)
      if not self._take_token(learner):
        raise self._refuse(
            Code.RATE_LIMITED,
            f"learner {learner} reports progress more than {self.progress_per_s}/s",
        )
      if finished:
        self.finished.add(learner)
        self._act(self.sync.finished(learner, self.now()))
      else:  # (a finished learner with an upload in flight again: learner_loop.beat)
        self.finished.discard(learner)
      if report is not None:
        self.on_progress(learner, report)
        if "c_steps" in report:  # (where a restarted learner resumes: recovery/crash_machine.py)
          self.reported[learner] = (session, Peer(report["step"], tuple(report["c_steps"])))
      settled = self.settled()
      if settled and finished:  # (it may exit now: see `settled`)
        self.released.add(learner)
      return settled

  def _take_token(self, learner: int) -> bool:
    burst = max(self.progress_per_s, 1.0)
    tokens, last = self.buckets.get(learner, (burst, self.now()))
    tokens = min(burst, tokens + (self.now() - last) * self.progress_per_s)
    ok = tokens >= 1.0
    self.buckets[learner] = (tokens - 1.0 if ok else tokens, self.now())
    return ok

  def settled(self) -> bool:
    """Every learner that ever joined reported it finished (a restarted one must finish again),
    no upload waits for a merge and no send waits for a live learner, except one told settled
    and not heard from since (`released`).

    A finished learner that has just polled a merge may still send an upload it calls for (a
    rebase's progress); a peer told settled in between exits, and that upload's merge would
    wait for it to poll until it was found absent (`absent_after_s`): the learner that sent it
    was not settled within its 3 s deliver timeout in one test_learner_process.py run of four
    on a loaded machine. A released learner that beats or uploads again counts again."""
    waited_for = self.sync.live - self.released
    return (
        bool(self.sync.members)
        and self.sync.members <= self.finished
        and not any(self.sync.pending)
        and not any(self.outbox.get(m) for m in waited_for)
    )

  def upload(
      self, learner: int, session: str, up: protocol.Upload, started: float | None = None
  ) -> int:
    """Hands an upload to the synchronizer; returns how many merges it triggered.

    Clocks of different hosts are not comparable, so the upload's times are the host's own:
    it arrived now and left when its first chunk came in (`started`, host time), or now.
    """
    with self._serving(learner, session), self.cond:
      self._check_session(learner, session)
      self.released.discard(learner)
      if up.learner != learner:
        raise self._refuse(Code.INVALID, f"upload names learner {up.learner}, sent by {learner}")
      now = self.now()
      self.on_upload(learner, session, up.step)  # (trained, whatever the synchronizer decides)
      own_sent = up.sent_time
      up = dataclasses.replace(up, time=now, sent_time=now if started is None else started)
      self.sent_as[(learner, up.fragment)] = (up.sent_time, own_sent)
      before = self.merges
      actions = self.sync.handle(up)
      refused = answer(actions, up)
      self._act(actions, answered=refused)
      if refused is not None:
        self.count(refused.code)
        raise Refused(
            refused.code,
            f"upload of fragment {up.fragment} rejected ({refused.code}): {refused.reason}",
        )
      return self.merges - before

  def poll(
      self, learner: int, session: str, after_seq: int, wait_s: float
  ) -> list[tuple[int, protocol.Send | protocol.Refused]]:
    """Sends (and late refusals) numbered after `after_seq`, waiting up to `wait_s` for one."""
    deadline = time.monotonic() + max(wait_s, 0.0)
    with self._serving(learner, session), self.cond:
      self._check_session(learner, session)
      while True:
        box = self.outbox[learner]
        box[:] = [(s, m) for s, m in box if s > after_seq]  # acknowledged: forget
        if box or self._stop.is_set():
          return list(box)
        left = deadline - time.monotonic()
        if left <= 0:
          return []
        self.cond.wait(left)
        if self.sessions.get(learner) != session:
          raise self._refuse(Code.NOT_JOINED, f"learner {learner} joined elsewhere")
        self.last_seen[learner] = self.now()

  # ---- actions, timers and liveness ----

  @contextlib.contextmanager
  def _serving(self, learner: int, session: str):
    """A learner is heard while a call of its session is served and silent from when the last
    one ended: waiting for the lock a merge holds, or in a poll for its result, is not silence.
    (A first merge that compiled under the lock for 5 s on a loaded machine had both learners
    of a synchronous run found absent while they waited on it: tests/test_threads.py.)"""
    with self._serving_lock:
      self.serving[(learner, session)] += 1
    try:
      yield
    finally:
      with self._serving_lock:
        self.serving[(learner, session)] -= 1
        if not self.serving[(learner, session)]:
          del self.serving[(learner, session)]
        if self.sessions.get(learner) == session:
          self.last_seen[learner] = max(self.last_seen.get(learner, 0.0), self.now())

  def _act(self, actions: list[protocol.Action], answered=None) -> None:
    """Carries out the synchronizer's actions; a refusal that is not the calling upload's answer
    (`answered`) goes to its learner's poll, naming the upload by the learner's own sent time."""
    for a in actions:
      if isinstance(a, protocol.Send):
        if a.learner in self.outbox:
          self.last_seq[a.learner] += 1
          self.outbox[a.learner].append((self.last_seq[a.learner], a))
      elif isinstance(a, protocol.SetTimer):
        heapq.heappush(self.timers, a.time)
      elif isinstance(a, protocol.Checkpoint):
        self.on_checkpoint(self.sync)
      elif isinstance(a, protocol.Log):
        self.merges += a.record["event"] == "merge"
        self.on_log(a.record)
      elif isinstance(a, protocol.Refused):
        self.on_log(a.record)
        if a is not answered and a.fragment is not None and a.learner in self.outbox:
          host_sent, own_sent = self.sent_as.get((a.learner, a.fragment), (None, None))
          late = dataclasses.replace(a, sent_time=own_sent if host_sent == a.sent_time else None)
          self.last_seq[a.learner] += 1
          self.outbox[a.learner].append((self.last_seq[a.learner], late))
    self.cond.notify_all()

  def _background(self) -> None:
    while not self._stop.wait(0.05):
      with self.cond:
        self.tick(self.now())

  def tick(self, now: float) -> None:
    """Fires the timers due by `now` and finds the silent learners absent (under the lock)."""
    while self.timers and self.timers[0] <= now:
      heapq.heappop(self.timers)
      self._act(self.sync.handle(protocol.Tick(now)))
    for m in sorted(self.sync.live):
      if self.serving[(m, self.sessions.get(m))] > 0:
        continue
      if now - self.last_seen.get(m, now) > self.absent_after_s:
        self.counts["absent"] = self.counts.get("absent", 0) + 1
        self.on_log({"event": "absent", "learner": m, "time": now})
        self.absent_since[m] = now
        self._act(self.sync.handle(protocol.Leave(m, now)))

  def close(self) -> None:
    self._stop.set()
    with self.cond:
      self.cond.notify_all()
    self._thread.join(timeout=2.0)
