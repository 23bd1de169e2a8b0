"""Crashes and restarts of a threads run, in real time: the fault timeline and what it does.

A timeline thread acts at each fault's wall time (see faulty_link.FaultClock):

- crash learner m: its thread stops at its next step boundary (the step in progress is lost with
  it) and its memory is gone (train state, counters, its copy of the globals; its link gets a new
  session, sends on their way to it are lost). The synchronizer is not told: it finds out when m's
  heartbeats stop (`absent_after_s`), as with a real process. When the fault ends m restores its
  newest learner checkpoint (diloco/recovery/learner_checkpoint.py), or starts over from the initial
  parameters holding no fragment, so that its Join fetches every global fragment before it trains;
  it resumes where the crash-and-rejoin machine says, as in every runtime
  (diloco/recovery/crash_machine.py: the leading live learner's phase, or its last merge point
  where lockstep rounds wait). It has rejoined once it holds at least the versions
  the synchronizer had when its Join was answered; the record then says whether each fragment it
  holds at the synchronizer's current version is bit-identical to the synchronizer's.
- sync_crash: the host goes down (learners' calls fail as unreachable; they keep training), its
  memory is lost; after the fault's duration a new Synchronizer restarts from the newest
  checkpoint (diloco/recovery/sync_checkpoint.py) as a new generation in a new SyncHost, and learners
  re-join it. Mode 'save': it dies during its next checkpoint write instead (the half-written save
  is ignored, so the previous one is restored). The restart record says whether the restored
  state equals, array for array, the state the last completed save wrote.
- straggle: the learner's steps take `factor` times as long (it sleeps after each step); delay,
  partition, corrupt and poison act on its link (faulty_link.FaultyLink).

Faults due when every learner has trained its steps, or a crash of a learner that has, are ignored.
"""

import dataclasses
import heapq
import threading
import time
from collections.abc import Callable

import numpy as np

from diloco.chaos import schedule as chaos
from diloco.outer.learner.learner import Learner
from diloco.recovery import crash_machine, rejoin as recovery_lib, sync_checkpoint
from diloco.runtime import sync_host
from diloco.runtime.faulty_link import FaultClock, FaultyLink, HostSlot, Shared


class Driver:
  """The fault timeline of one threads run and the crash/restart of learners and synchronizer."""

  def __init__(
      self,
      *,
      clock: FaultClock,
      slot: HostSlot,
      shared: Shared,
      recovery: recovery_lib.Recovery | None,
      make_sync: Callable,
      make_host: Callable,
      learners: list[Learner],
      links: list[FaultyLink],
      steps: int,
      lockstep: bool = False,
      on_event: Callable[[dict], None] = lambda r: None,
  ):
    self.clock, self.slot, self.shared, self.recovery = clock, slot, shared, recovery
    self.make_sync, self.make_host, self.on_event = make_sync, make_host, on_event
    self.learners, self.links, self.steps = learners, links, steps
    n = len(learners)
    self.stops = [threading.Event() for _ in range(n)]
    self.abort = threading.Event()
    self.up = [True] * n
    self.crashes = crash_machine.CrashMachine(n, lockstep)
    shared.stats.crashes, shared.stats.steps_lost = self.crashes.crashes, self.crashes.steps_lost
    self._back: dict[int, float] = {}
    self._save_crash: chaos.Fault | None = None
    self.saved: tuple[int, dict] | None = None  # (merges, arrays) of the last completed save
    self._cond = threading.Condition()
    self._timeline: list[tuple[float, int, Callable, object]] = []
    self._seq = 0
    self._first: set[int] = set()  # learners that took their first step
    # Each learner's (steps, c_steps) as of its last step, read together (its thread steps on
    # while another reads it): what a resuming learner's machine sees of it.
    self._seen: dict[int, crash_machine.Peer] = {}
    self._held: dict[int, tuple[int, ...]] = {}  # ... and the versions it held then
    self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-timeline")
    # Synchronizers to restart into, built now in this thread: building one (its outer
    # optimizer states on the CPU device) while learner threads run their steps has hung XLA's
    # CPU collectives here (an all-reduce rendezvous that never completed).
    self._spares = [make_sync() for f in clock.faults if f.kind == "sync_crash"]

  # ---- the timeline ----

  def start(self) -> None:
    """Time 0 of the schedule: called once every learner has taken its first step (compiled)."""
    self.clock.start()
    for f in self.clock.faults:
      self._push(self.clock.wall(f.time_s), self._on_fault, f)
    self._thread.start()

  def _push(self, wall: float, fn: Callable, arg) -> None:
    with self._cond:
      self._seq += 1
      heapq.heappush(self._timeline, (wall, self._seq, fn, arg))
      self._cond.notify_all()

  def _run(self) -> None:
    while True:
      with self._cond:
        while not self.abort.is_set() and (
            not self._timeline or self._timeline[0][0] > self.clock.clock()
        ):
          self._cond.wait(None if not self._timeline else self._timeline[0][0] - self.clock.clock())
        if self.abort.is_set():
          return
        _, _, fn, arg = heapq.heappop(self._timeline)
      fn(arg)

  def _log(self, record: dict) -> None:
    self.on_event({"time": self.clock.now(), **record})

  def _training(self) -> bool:
    return any(l.steps < self.steps for l in self.learners) and not self.abort.is_set()

  def _on_fault(self, f: chaos.Fault) -> None:
    st = self.shared.stats
    if not self._training():
      st.ignored += 1
    elif f.kind == "crash":
      self._crash(f)
    elif f.kind == "sync_crash":
      if f.mode == "now" and self.slot.host is not None:
        self._sync_down(f, self.slot.take_down())
      elif f.mode == "save" and self.slot.host is not None and self._save_crash is None:
        self._save_crash = f  # counted when it fires
      else:
        st.ignored += 1
    elif f.kind in ("straggle", "delay", "partition"):  # looked up by time where they act
      self.shared.fault(f)
      self._log({"event": "fault", "kind": f.kind, "learner": f.learner, "fault": f.describe()})
    # corrupt and poison: armed in the learner's link, counted when a message carries them

  # ---- learner crash and rejoin ----

  def _crash(self, f: chaos.Fault) -> None:
    m = f.learner
    if not self.up[m] or self.learners[m].steps >= self.steps:
      self.shared.stats.ignored += 1
      return
    self.shared.fault(f)
    with self.shared.lock:  # (check_rejoin reads both under it)
      self.up[m] = False
      self.crashes.crash(m, self.clock.now(), f.end_s, wall=self.clock.clock())
    self._back[m] = f.end_s
    self._log({"event": "fault", "kind": "crash", "learner": m, "fault": f.describe()})
    self.stops[m].set()

  def crashed(self, m: int) -> bool:
    return not self.up[m] and not self.abort.is_set()

  def recover(self, m: int) -> Learner | None:
    """In learner m's thread after its crash: loses its memory, waits out the fault, restores
    (or starts over); the learner to train on, or None if the run was aborted meanwhile."""
    old = self.learners[m]
    step_at_crash = old.steps
    old.state = None  # its memory is gone
    old.global_copy = []
    self.links[m].new_session()
    if self.abort.wait(max(self.clock.wall(self._back[m]) - self.clock.clock(), 0.0)):
      return None
    learner, step = self.recovery.restore_learner(m)
    host, _ = self.slot.get()
    merged = None
    if host is not None:  # (read before the shared lock: the host's log takes it under its own)
      with host.cond:
        merged = list(host.sync.versions)
    with self.shared.lock:
      seen = [(i, p) for i, p in self._seen.items() if self.up[i] and i != m]
      peers = [self._merged_since(i, p, merged) for i, p in seen]
      learner.steps = self.crashes.recover(
          m, step, learner.steps, learner.schedule.inner_steps, peers, step_at_crash
      )
      self.crashes.rejoining[m].update(  # (what it resumed by, for the run's summary)
          resumes_at_step=learner.steps, peers=[dataclasses.asdict(p) for p in peers]
      )
    self.learners[m] = learner
    self.stops[m].clear()
    self.up[m] = True
    self._log(
        {"event": "recover", "learner": m, "restored_step": step, "resumes_at_step": learner.steps}
    )
    return learner

  def _merged_since(
      self, i: int, peer: crash_machine.Peer, merged: list[int] | None
  ) -> crash_machine.Peer:
    """Learner i as last seen, less the progress of each fragment the synchronizer has merged
    past the version i held then: a blocking learner waits at its upload (overlap 0; with an
    overlap tau up to tau steps after it), so that merge holds its upload, and its merge point
    is where it stands. (Seen only after a step, it
    may not have received it yet: a peer that crashed then resumed a round behind, redoing a
    round its own upload had already merged, and the run's last round waited for it in vain.)"""
    held = self._held.get(i)
    if merged is None or held is None:
      return peer
    c = tuple(0 if v < g else c for c, v, g in zip(peer.c_steps, held, merged))
    return crash_machine.Peer(peer.steps, c)

  def check_rejoin(self, m: int) -> None:
    """Marks m rejoined once it holds what the synchronizer sent it at its Join."""
    learner = self.learners[m]
    if not self.crashes.is_rejoining(m) or not self.up[m]:
      return
    if not crash_machine.rejoin_complete(learner.versions, self.links[m].joined_versions):
      return
    host, _ = self.slot.get()
    if host is None:
      return
    with host.cond:
      sync = host.sync
      same = [
          p
          for p in range(len(learner.versions))
          if (learner.generations[p], learner.versions[p]) == (sync.generation, sync.versions[p])
      ]
      exact = all(
          np.array_equal(learner.global_copy[p][k], sync.globals[p][k])
          for p in same
          for k in sync.globals[p]
      )
    with self.shared.lock:
      if not self.crashes.is_rejoining(m) or not self.up[m]:  # crashed again meanwhile
        return
      record = self.crashes.rejoined(
          m,
          self.clock.now(),
          rejoined_wall=self.clock.clock(),
          fragments_at_current_version=len(same),
          holds_global_exactly=bool(exact),
      )
    self._log(
        {
            "event": "rejoin",
            "learner": m,
            "down_s": record["rejoined"] - record["time"],
            "holds_global_exactly": bool(exact),
        }
    )

  def on_step(self, m: int) -> Callable:
    """Learner m's after-step hook: its checkpoint, straggling, the rejoin check."""
    last = [time.monotonic()]

    def hook(learner: Learner, _metrics) -> None:
      with self._cond:
        if self.clock.t0 is None and m not in self._first:
          self._first.add(m)
          if len(self._first) == len(self.learners):
            self.start()
      with self.shared.lock:
        self._seen[m] = crash_machine.Peer(learner.steps, tuple(learner.c_steps))
        self._held[m] = tuple(learner.versions)
      if self.recovery is not None:
        self.recovery.after_step(learner)
      now = time.monotonic()
      factor = self.clock.layer.stretch(m, self.clock.now())
      if factor > 1:  # the iteration just taken, stretched to factor x its length
        time.sleep((factor - 1) * (now - last[0]))
      last[0] = time.monotonic()
      self.check_rejoin(m)

    return hook

  # ---- synchronizer crash and restart ----

  def _sync_down(self, f: chaos.Fault, host: sync_host.SyncHost | None) -> None:
    if host is None:
      self.shared.stats.ignored += 1
      return
    self.shared.fault(f)
    now = self.clock.now()
    with self.shared.lock:
      self.shared.stats.restarts.append(
          {
              "time": now,
              "back": now + f.duration_s,
              "merges": host.sync.merges,
              "restored": None,
              "mode": f.mode,
          }
      )
    self._log(
        {"event": "fault", "kind": "sync_crash", "fault": f.describe(), "merges": host.sync.merges}
    )
    host.close()
    self._push(self.clock.wall(now + f.duration_s), self._sync_restart, None)

  def _sync_restart(self, _=None) -> None:
    restarts = self.shared.stats.restarts
    sync = self.recovery.restore_sync(
        lambda: self._spares.pop() if self._spares else self.make_sync(), generation=len(restarts)
    )
    record = restarts[-1]
    arrays = sync.state_dict()["arrays"]
    merges, saved = self.saved
    record.update(
        restored=sync.merges,
        checkpoint_merges=merges,
        restored_equals_checkpoint=bool(
            sync.merges == merges
            and sorted(arrays) == sorted(saved)
            and all(np.array_equal(arrays[k], saved[k]) for k in saved)
        ),
    )
    self.slot.put(self.make_host(sync))
    self._log(
        {
            "event": "sync_restart",
            "generation": sync.generation,
            "merges": sync.merges,
            "merges_lost": record["merges"] - sync.merges,
        }
    )

  def on_checkpoint(self, sync) -> None:
    """The host's Checkpoint action (under its lock): save, or die saving ('save' crash)."""
    host = self.slot.host
    if self.recovery is None or host is None or host.sync is not sync:
      return  # a synchronizer already dead writes nothing
    if self._save_crash is not None:
      f, self._save_crash = self._save_crash, None
      try:
        self.recovery.save_sync(sync, interrupt=True)
      except sync_checkpoint.SimulatedCrash:
        pass
      self._push(self.clock.clock(), lambda dead: self._sync_down(f, dead), self.slot.take_down())
      return
    self.save_sync(sync)

  def save_sync(self, sync) -> None:
    """Saves the synchronizer and remembers what the save wrote (to check a restore)."""
    state = sync.state_dict()
    if self.recovery is not None and self.recovery.save_sync(sync):
      self.saved = (sync.merges, {k: np.array(v) for k, v in state["arrays"].items()})

  def finish(self) -> None:
    """Stops the timeline; a synchronizer still down comes back from its checkpoint."""
    self.abort.set()
    with self._cond:
      self._cond.notify_all()
    if self._thread.ident is not None:
      self._thread.join(timeout=5.0)
    if self.slot.host is None and self.shared.stats.restarts:
      self._sync_restart()


def summary(driver: Driver, sync, events: list[dict]) -> dict:
  """The chaos keys of a threads run's summary (as the virtual runtime's, where they apply)."""
  st = driver.shared.stats
  with driver.shared.lock:
    driver.shared.poisoned.finish()
  crashes = st.crashes
  tainted = {k: dict(sorted(v.items())) for k, v in sorted(st.tainted.items())}
  unused = driver.clock.layer.unused + (driver._save_crash is not None)
  return {
      "faults": dict(sorted(st.faults.items())),
      "rejoins": sum(c["rejoined"] is not None for c in crashes),
      "synchronizer_restarts": len(st.restarts),
      "chaos": {
          "faults_scheduled": len(driver.clock.faults),
          "faults_ignored": st.ignored,
          "faults_unused": unused,
          "time_scale": driver.clock.scale,
          "crashes": crashes,
          "restarts": st.restarts,
          # ... unless it crashed again before its rejoin was complete
          "every_crashed_learner_rejoined": all(
              c["rejoined"] is not None for c in crashes if "crashed_again" not in c
          ),
          "restored_from_checkpoint": sum(c["restored_step"] is not None for c in crashes),
          "steps_lost": int(sum(st.steps_lost)),
          "messages_dropped": dict(sorted(st.dropped.items())),
          "tainted": tainted,
          "tainted_merged": sum(v.get("merged", 0) for v in tainted.values()),
          "global_params_finite": bool(
              all(np.isfinite(v).all() for v in sync.global_params().values())
          ),
          "events": events,
      },
  }
