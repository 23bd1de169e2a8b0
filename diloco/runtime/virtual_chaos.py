"""The virtual runtime with a fault schedule applied (see diloco/chaos/schedule.py for the faults).

- crash learner m: its memory is lost (state, counters, its data position since its checkpoint);
  events addressed to it are dropped (its epoch moves on); the synchronizer gets Leave(m) at once.
  Work since its last checkpoint, and the step it was in, are wasted, and their tokens return to the
  budget (it reads them again). When it comes back it restores its checkpoint (or starts over, see
  recovery/rejoin.py) and re-joins with the versions it holds; the rejoin is complete once every
  fragment the synchronizer sent in answer has arrived, and it trains only from then on (a step taken before
  would be overwritten by them), unless the synchronizer is down when it comes back: then one
  restored from its checkpoint trains on it meanwhile. Rounds in progress at its Join do not wait
  for it, unless the quorum counts crashed members (synchronous DiLoCo without elasticity). Where
  it resumes, and its crash record, are the crash-and-rejoin machine's, as in every runtime
  (diloco/recovery/crash_machine.py: the leading live learner's phase, or its last merge point
  where lockstep rounds wait for it).
- sync_crash: the synchronizer's memory is lost (open rounds, timers, messages in flight to it);
  learners keep training and keep their unanswered uploads; it restarts from its newest checkpoint
  as a new generation, every live learner re-joins and sends again each fragment still unanswered,
  computed afresh. Mode 'save': it dies during its next checkpoint write instead.
- straggle multiplies a learner's step times. The message faults (delay, partition, corrupt,
  poison) and the learners' answers to refused messages are in `virtual_faults.py`.

A learner that receives a Send it cannot apply (`Learner.accepts`: corrupt, or a gap after lost
messages) drops it and re-joins (at most one Join of its in flight); so does one whose upload is
refused for its base version. One whose upload arrived corrupt sends that fragment again, once,
computed afresh (non-finite and outlier uploads are refused when their round merges without them:
the learner's next scheduled upload carries its progress). If every live learner waits on a round
while nothing else can happen (lockstep learners put out of phase by faults wait on each other's
rounds), the one waiting longest gives up after `wait_timeout_s` and trains on. Faults are
background events: they do not keep a finished run alive, and faults after the token budget is
spent are ignored.
"""

import numpy as np

from diloco.chaos import faults as fault_layer, schedule as chaos
from diloco.chaos.stats import ChaosStats, Taints
from diloco.outer import learner_machine, protocol
from diloco.outer.learner import Learner
from diloco.recovery import crash_machine, sync_checkpoint
from diloco.runtime import virtual
from diloco.runtime.virtual import AT_LEARNER, FAULT, START, SYNC
from diloco.runtime.virtual_faults import FaultyMessages


class ChaosRuntime(FaultyMessages, virtual.VirtualRuntime):
  """VirtualRuntime plus faults; needs a `recovery.Recovery` and a synchronizer factory."""

  def __init__(
      self,
      *args,
      faults: list[chaos.Fault],
      make_sync,
      seed: int,
      wait_timeout_s: float = 0.0,
      on_chaos=lambda record: None,
      **kwargs,
  ):
    super().__init__(*args, **kwargs)
    if self.recovery is None:
      raise ValueError("a chaos run needs checkpoints and restarts (a Recovery)")
    n = len(self.learners)
    self.layer = fault_layer.FaultLayer(faults, armed=False)  # taints armed at their events
    self.make_sync, self.on_chaos = make_sync, on_chaos
    self.wait_timeout_s = wait_timeout_s
    self._rounds_wait = self.sync.policy.quorum.of_members  # rounds wait for crashed learners
    self.rng = np.random.default_rng([seed, 0xC4A05])
    self.crashes = crash_machine.CrashMachine(n, lockstep=self.blocking and self._rounds_wait)
    self.stats = ChaosStats(crashes=self.crashes.crashes, steps_lost=self.crashes.steps_lost)
    self.up = [True] * n
    self.sync_up = True
    self._step = [None] * n  # (start, duration) of the step in progress
    self._since_ckpt = [[0, 0.0] for _ in range(n)]  # steps, busy seconds since a checkpoint
    self._crash_on_save: chaos.Fault | None = None
    self._heals: set = set()
    self._owed: list[dict[int, tuple]] = [{} for _ in range(n)]  # p -> base, dropped
    self.taints = Taints(self.stats)

  # ---- the loop ----

  def run(self) -> float:
    for i, f in enumerate(self.layer.faults):
      self._push(f.time_s, FAULT, "fault", i, background=True)
    return super().run()

  def _budget_left(self) -> bool:
    return self.tokens_started + min(l_.tokens_per_step for l_ in self.learners) <= self.budget

  def _more(self) -> bool:
    if super()._more():
      return True
    if not self._budget_left():
      return False
    if not self.sync_up or not all(self.up) or getattr(self.sync, "down", None):
      return bool(self._queue)  # something is down: its recovery is on the way
    return self._break_stall()

  def _break_stall(self) -> bool:
    """Lockstep learners all waiting for rounds that wait for each other (faults can put one
    out of phase): the one waiting longest gives up after `wait_timeout_s` and trains on."""
    waiting = [
        (c.waiting_since, m)
        for m, c in enumerate(self.clocks)
        if self.up[m] and c.waiting_since is not None and self.machines[m].inflight
    ]
    if not waiting:
      return False
    since, m = min(waiting)
    self._push(max(self.now, since + self.wait_timeout_s), AT_LEARNER, "give_up", m, owner=m)
    return True

  def _on_give_up(self, m: int) -> None:
    self.stats.stalls_broken += 1
    self._log({"event": "give_up", "learner": m, "fragments": self.machines[m].give_up()})
    self._push(self.now, START, "start", m, owner=m)

  def _log(self, record: dict) -> None:
    self.on_chaos({"time": self.now, **record})

  def _on_fault(self, i: int) -> None:
    f = self.layer.faults[i]
    m = f.learner
    if not self._budget_left():
      self.stats.ignored += 1
      return
    if f.kind == "crash":
      if self.up[m]:
        return self._crash(m, f)
    elif f.kind == "sync_crash" and f.shard is not None:
      if self.sync_up and f.shard not in getattr(self.sync, "down", {f.shard}):
        return self._shard_crash(f)
    elif f.kind == "sync_crash":
      if self.sync_up and f.mode == "now":
        return self._sync_crash(f)
      if self.sync_up and self._crash_on_save is None:
        self._crash_on_save = f  # counted when it fires
        return
    elif f.kind in ("corrupt", "poison"):
      self.layer.arm(f)  # counted when a message carries it
      return
    else:  # straggle, delay, partition: looked up by time when steps and messages happen
      self.stats.faults[f.kind] += 1
      self._log({"event": "fault", "kind": f.kind, "learner": m, "fault": f.describe()})
      return
    self.stats.ignored += 1

  # ---- learner crash and rejoin ----

  def _crash(self, m: int, f: chaos.Fault) -> None:
    self.stats.faults["crash"] += 1
    self._epochs[m] += 1
    self.up[m] = False
    clock, learner = self.clocks[m], self.learners[m]
    lost_steps, wasted = self._since_ckpt[m]
    if self._step[m] is not None:  # the step in progress never finishes
      self.trace.cut(m, self.now)
      start, duration = self._step[m]
      clock.busy_s -= start + duration - self.now
      wasted += self.now - start
      lost_steps += 1
      self.tokens_started -= learner.tokens_per_step
    clock.wasted_s += wasted
    # Their tokens were never trained into what survives: the restored learner reads them again
    # from its checkpoint's data position, so they come back to the budget.
    self.tokens_started -= self._since_ckpt[m][0] * learner.tokens_per_step
    self._stop_waiting(m)
    self.machines[m].crashed()
    self._owed[m].clear()
    self._step[m], self._since_ckpt[m] = None, [0, 0.0]
    learner.state = None  # its memory is gone; recovery builds a new learner
    self.crashes.crash(m, self.now, f.end_s, steps_lost=lost_steps)
    self._log(
        {
            "event": "fault",
            "kind": "crash",
            "learner": m,
            "fault": f.describe(),
            "steps_lost": lost_steps,
        }
    )
    if self.sync_up:
      self._handle(protocol.Leave(m, self.now))
    self._push(f.end_s, FAULT, "recover", m, background=True)

  def _on_recover(self, m: int) -> None:
    learner, step = self.recovery.restore_learner(m)
    self.learners[m] = learner
    self.machines[m].held = learner
    decisions = self.machines[m].restored()  # to join again, and train once rejoined
    self.up[m] = True
    clock = self.clocks[m]
    clock.waiting_since, clock.done = None, False
    peers = crash_machine.peers_of(self.learners, self.up, m)
    learner.steps = self.crashes.recover(
        m, step, learner.steps, learner.schedule.inner_steps, peers
    )
    self._log(
        {"event": "recover", "learner": m, "restored_step": step, "resumes_at_step": learner.steps}
    )
    if self.sync_up:
      self._decide(m, decisions)
    elif step is not None:  # nobody to rejoin yet: it trains on its checkpoint meanwhile
      self.crashes.rejoining[m]["training"] = True
      self._push(self.now, START, "start", m, owner=m)

  def _do_rejoin(self, m: int, d) -> None:
    """A resync is counted and needs both ends up; a restored learner, or every learner after
    a synchronizer restart, joins as it comes back."""
    if d.why in ("resync", "refused"):
      return self._resync(m)
    self.machines[m].join_inflight = False
    super()._do_rejoin(m, d)

  def _resync(self, m: int) -> None:
    if self.up[m] and self.sync_up and not self.machines[m].join_inflight:
      self.stats.resyncs += 1
      super()._do_rejoin(m, None)

  def _do_rejoined(self, m: int, d) -> None:
    if not self.crashes.is_rejoining(m):  # a late start's first Join (sim.start_times)
      return super()._do_rejoined(m, d)
    if self.up[m]:
      self._rejoined(m)

  def _rejoined(self, m: int) -> None:
    record = self.crashes.rejoined(m, self.now)
    self._log(
        {
            "event": "rejoin",
            "learner": m,
            "down_s": self.now - record["time"],
            "to_rejoin_s": self.now - record["back"],
        }
    )
    if not record.get("training"):  # it trains once it holds the newest global fragments
      self._push(self.now, START, "start", m, owner=m)

  # ---- synchronizer crash and restart ----

  def _sync_crash(self, f: chaos.Fault) -> None:
    self.stats.faults["sync_crash"] += 1
    sync = self.sync
    open_rounds = sum(1 for pending in sync.pending if pending)
    self.stats.merges_skipped += sync.rounds_skipped + open_rounds
    self.taints.synchronizer_crashed()
    back = self.now + f.duration_s  # a 'save' crash fires after its scheduled time
    self.stats.restarts.append(
        {"time": self.now, "back": back, "merges": sync.merges, "restored": None, "mode": f.mode}
    )
    self._log(
        {"event": "fault", "kind": "sync_crash", "fault": f.describe(), "merges": sync.merges}
    )
    self._epochs[SYNC] += 1
    self.sync_up, self.sync = False, None
    for machine in self.machines:
      machine.sync_lost()
    self._push(back, FAULT, "sync_restart", None, background=True)

  def _on_sync_restart(self, _) -> None:
    restarts = len(self.stats.restarts)
    self.sync = self.recovery.restore_sync(self.make_sync, generation=restarts)
    self.sync_up = True
    record = self.stats.restarts[-1]
    record["restored"] = self.sync.merges
    self._log(
        {
            "event": "sync_restart",
            "generation": restarts,
            "merges": self.sync.merges,
            "merges_lost": record["merges"] - self.sync.merges,
        }
    )
    for m in range(len(self.learners)):
      if self.up[m]:  # join it, and send again every unanswered upload, computed afresh
        self._decide(m, self.machines[m].sync_restarted())

  def _shard_crash(self, f: chaos.Fault) -> None:
    """Shard f.shard alone loses its memory (open rounds, messages on their way to it); the
    other shards merge on. It comes back from the run's newest checkpoint of the shards."""
    s, sync = f.shard, self.sync
    self.stats.faults["sync_crash"] += 1
    self.stats.merges_skipped += sum(1 for pending in sync.shards[s].pending if pending)
    self.stats.restarts.append(
        {"time": self.now, "back": self.now + f.duration_s, "merges": sync.merges, "shard": s}
        | {"restored": None, "mode": f.mode}
    )
    self._log({"event": "fault", "kind": "sync_crash", "fault": f.describe(), "shard": s})
    restarts = sum(r.get("shard") == s for r in self.stats.restarts)
    sync.crash(s, self.recovery.restore_shard(self.make_sync, s, generation=restarts))
    self._push(self.now + f.duration_s, FAULT, "shard_restart", s, background=True)

  def _on_shard_restart(self, s: int) -> None:
    self.sync.revive(s)
    shard = self.sync.shards[s]
    record = [r for r in self.stats.restarts if r.get("shard") == s][-1]
    record["restored"] = self.sync.merges
    self._log(
        {"event": "sync_restart", "shard": s, "generation": shard.generation}
        | {"merges": self.sync.merges, "merges_lost": record["merges"] - self.sync.merges}
    )
    fragments = self.sync.fragments_of(s)
    for m in range(len(self.learners)):
      if self.up[m]:  # join it, and send again its fragments' unanswered uploads
        self._decide(m, self.machines[m].shard_restarted(fragments))

  def _checkpoint(self, action: protocol.Checkpoint) -> None:
    if self._crash_on_save is None:
      return super()._checkpoint(action)
    f, self._crash_on_save = self._crash_on_save, None
    try:
      self.recovery.save_sync(self.sync, interrupt=True)
    except sync_checkpoint.SimulatedCrash:
      pass
    self._sync_crash(f)

  def _act(self, actions: list[protocol.Action]) -> None:
    for a in actions:
      if not self.sync_up:
        break  # the rest died with the synchronizer
      super()._act([a])

  # ---- steps ----

  def _duration(self, m: int) -> float:
    duration = self.layer.stretch(m, self.now, super()._duration(m))
    self._step[m] = (self.now, duration)
    return duration

  def _on_step_done(self, payload) -> None:
    m, _, duration = payload
    self._step[m] = None
    self._since_ckpt[m][0] += 1
    self._since_ckpt[m][1] += duration
    super()._on_step_done(payload)

  def _after_step(self, learner: Learner) -> bool:
    saved = super()._after_step(learner)
    if saved:
      self._since_ckpt[learner.index] = [0, 0.0]
    return saved

  # ---- messages: see virtual_faults.FaultyMessages; what a learner does on arrival ----

  def _on_at_learner(self, send: protocol.Send) -> None:
    decisions = self.machines[send.learner].arrived(send)
    drop = decisions[0] if isinstance(decisions[0], learner_machine.Drop) else None
    self.taints.arrived_down(send, drop.code if drop is not None else None)
    self._decide(send.learner, decisions)

  def _do_drop(self, m: int, d: learner_machine.Drop) -> None:
    self.stats.refused_by_learners[d.code.value] += 1

  def _handle(self, event: protocol.Event) -> None:
    """The synchronizer consumes `event`; its actions are followed, then carried out."""
    actions = self.sync.handle(event)
    decisions = []
    if isinstance(event, protocol.Join):
      decisions = self._join_answered(event.learner, actions)
    self.taints.handled(event, actions)
    self._act(actions)
    if decisions:
      self._decide(event.learner, decisions)

  def finish(self) -> None:
    """Brings a synchronizer still down back from its checkpoint (to evaluate and save it)."""
    if not self.sync_up:
      for record in self.crashes.rejoining.values():  # back, but nobody to rejoin
        record["sync_down_at_end"] = True
      self.sync = self.recovery.restore_sync(self.make_sync, generation=len(self.stats.restarts))
      self.sync_up = True
      self.stats.restarts[-1]["restored"] = self.sync.merges
    super().finish()
    self.taints.finish()
    self.stats.unused += self.layer.unused + (self._crash_on_save is not None)
