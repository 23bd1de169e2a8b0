"""A fault schedule acted out in a virtual run (see diloco/chaos/schedule.py for the faults).

`Chaos` is the runtime's fault component (`virtual.VirtualRuntime(..., faults=Chaos(...))`): it acts
at the runtime's hook points (virtual_hooks.py) and on the events it schedules itself, and holds
what the faults did (`stats`).

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
  poison) are `virtual_faults.FaultyMessages`, which a `Chaos` holds.

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
from diloco.outer import protocol
from diloco.outer.learner import learner_machine
from diloco.recovery import crash_machine, sync_checkpoint
from diloco.runtime import virtual_faults, virtual_hooks
from diloco.runtime.virtual import AT_LEARNER, FAULT, START, SYNC


class Chaos(virtual_hooks.Faults):
  """A virtual run's fault schedule; the run needs a `recovery.Recovery`, and this a
  synchronizer factory to restart from its checkpoints."""

  def __init__(
      self,
      faults: list[chaos.Fault],
      make_sync,
      seed: int,
      wait_timeout_s: float = 0.0,
      on_chaos=lambda record: None,
  ):
    self.layer = fault_layer.FaultLayer(faults, armed=False)  # taints armed at their events
    self.make_sync, self.on_chaos = make_sync, on_chaos
    self.wait_timeout_s = wait_timeout_s
    self.rng = np.random.default_rng([seed, 0xC4A05])

  def bind(self, runtime) -> None:
    super().bind(runtime)
    if runtime.recovery is None:
      raise ValueError("a chaos run needs checkpoints and restarts (a Recovery)")
    n = len(runtime.learners)
    self._rounds_wait = runtime.sync.policy.quorum.of_members  # rounds wait for crashed learners
    self.crashes = crash_machine.CrashMachine(n, lockstep=runtime.blocking and self._rounds_wait)
    self.stats = ChaosStats(crashes=self.crashes.crashes, steps_lost=self.crashes.steps_lost)
    self.up = [True] * n
    self.sync_up = True
    self._step = [None] * n  # (start, duration) of the step in progress
    self._since_ckpt = [[0, 0.0] for _ in range(n)]  # steps, busy seconds since a checkpoint
    self._crash_on_save: chaos.Fault | None = None
    self.taints = Taints(self.stats)
    self.messages = virtual_faults.FaultyMessages(self, n)

  # ---- the loop ----

  def start(self) -> None:
    for i, f in enumerate(self.layer.faults):
      self.runtime.push(f.time_s, FAULT, "fault", i, background=True)

  def _budget_left(self) -> bool:
    rt = self.runtime
    return rt.tokens_started + min(l_.tokens_per_step for l_ in rt.learners) <= rt.budget

  def goes_on(self) -> bool:
    if not self._budget_left():
      return False
    if not self.sync_up or not all(self.up) or getattr(self.runtime.sync, "down", None):
      return bool(self.runtime.queue)  # something is down: its recovery is on the way
    return self._break_stall()

  def _break_stall(self) -> bool:
    """Lockstep learners all waiting for rounds that wait for each other (faults can put one
    out of phase): the one waiting longest gives up after `wait_timeout_s` and trains on."""
    rt = self.runtime
    waiting = [
        (c.waiting_since, m)
        for m, c in enumerate(rt.clocks)
        if self.up[m] and c.waiting_since is not None and rt.machines[m].inflight
    ]
    if not waiting:
      return False
    since, m = min(waiting)
    rt.push(max(rt.now, since + self.wait_timeout_s), AT_LEARNER, "give_up", m, owner=m)
    return True

  def on_give_up(self, m: int) -> None:
    self.stats.stalls_broken += 1
    self.log({"event": "give_up", "learner": m, "fragments": self.runtime.machines[m].give_up()})
    self.runtime.push(self.runtime.now, START, "start", m, owner=m)

  def log(self, record: dict) -> None:
    self.on_chaos({"time": self.runtime.now, **record})

  def on_fault(self, i: int) -> None:
    f = self.layer.faults[i]
    m = f.learner
    if not self._budget_left():
      self.stats.ignored += 1
      return
    if f.kind == "crash":
      if self.up[m]:
        return self._crash(m, f)
    elif f.kind == "sync_crash" and f.shard is not None:
      if self.sync_up and f.shard not in getattr(self.runtime.sync, "down", {f.shard}):
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
      self.log({"event": "fault", "kind": f.kind, "learner": m, "fault": f.describe()})
      return
    self.stats.ignored += 1

  # ---- learner crash and rejoin ----

  def _crash(self, m: int, f: chaos.Fault) -> None:
    rt = self.runtime
    self.stats.faults["crash"] += 1
    rt.epochs[m] += 1
    self.up[m] = False
    clock, learner = rt.clocks[m], rt.learners[m]
    lost_steps, wasted = self._since_ckpt[m]
    if self._step[m] is not None:  # the step in progress never finishes
      rt.trace.cut(m, rt.now)
      start, duration = self._step[m]
      clock.busy_s -= start + duration - rt.now
      wasted += rt.now - start
      lost_steps += 1
      rt.tokens_started -= learner.tokens_per_step
    clock.wasted_s += wasted
    # Their tokens were never trained into what survives: the restored learner reads them again
    # from its checkpoint's data position, so they come back to the budget.
    rt.tokens_started -= self._since_ckpt[m][0] * learner.tokens_per_step
    rt.stop_waiting(m)
    rt.machines[m].crashed()
    self.messages.owed[m].clear()
    self._step[m], self._since_ckpt[m] = None, [0, 0.0]
    learner.state = None  # its memory is gone; recovery builds a new learner
    self.crashes.crash(m, rt.now, f.end_s, steps_lost=lost_steps)
    self.log(
        {"event": "fault", "kind": "crash", "learner": m, "fault": f.describe()}
        | {"steps_lost": lost_steps}
    )
    if self.sync_up:
      self.handle(protocol.Leave(m, rt.now))
    rt.push(f.end_s, FAULT, "recover", m, background=True)

  def on_recover(self, m: int) -> None:
    rt = self.runtime
    learner, step = rt.recovery.restore_learner(m)
    rt.learners[m] = learner
    rt.machines[m].held = learner
    decisions = rt.machines[m].restored()  # to join again, and train once rejoined
    self.up[m] = True
    clock = rt.clocks[m]
    clock.waiting_since, clock.done = None, False
    peers = crash_machine.peers_of(rt.learners, self.up, m)
    learner.steps = self.crashes.recover(
        m, step, learner.steps, learner.schedule.inner_steps, peers
    )
    self.log(
        {"event": "recover", "learner": m, "restored_step": step, "resumes_at_step": learner.steps}
    )
    if self.sync_up:
      rt.decide(m, decisions)
    elif step is not None:  # nobody to rejoin yet: it trains on its checkpoint meanwhile
      self.crashes.rejoining[m]["training"] = True
      rt.push(rt.now, START, "start", m, owner=m)

  def rejoins(self, m: int, why: str) -> bool:
    """A resync is counted and needs both ends up; a restored learner, or every learner after
    a synchronizer restart, joins as it comes back (a Join still in flight died)."""
    if why in ("resync", "refused"):
      return self._resyncs(m)
    self.runtime.machines[m].join_inflight = False
    return True

  def _resyncs(self, m: int) -> bool:
    """Whether learner m may resync now (counted): both ends up, no Join of its in flight."""
    if self.up[m] and self.sync_up and not self.runtime.machines[m].join_inflight:
      self.stats.resyncs += 1
      return True
    return False

  def resync(self, m: int) -> None:
    """Learner m re-joins, if it may (`_resyncs`)."""
    if self._resyncs(m):
      self.runtime.join(m)

  def rejoined(self, m: int) -> bool:
    if not self.crashes.is_rejoining(m):  # a late start's first Join (sim.start_times)
      return True
    return self.up[m] and self._rejoined(m)

  def _rejoined(self, m: int) -> bool:
    """A crashed learner's rejoin is complete; whether it trains from now on (not: it already
    does, on its checkpoint, having come back while the synchronizer was down)."""
    now = self.runtime.now
    record = self.crashes.rejoined(m, now)
    self.log(
        {
            "event": "rejoin",
            "learner": m,
            "down_s": now - record["time"],
            "to_rejoin_s": now - record["back"],
        }
    )
    return not record.get("training")

  # ---- synchronizer crash and restart ----

  def _sync_crash(self, f: chaos.Fault) -> None:
    rt = self.runtime
    self.stats.faults["sync_crash"] += 1
    sync = rt.sync
    open_rounds = sum(1 for pending in sync.pending if pending)
    self.stats.merges_skipped += sync.rounds_skipped + open_rounds
    self.taints.synchronizer_crashed()
    back = rt.now + f.duration_s  # a 'save' crash fires after its scheduled time
    self.stats.restarts.append(
        {"time": rt.now, "back": back, "merges": sync.merges, "restored": None, "mode": f.mode}
    )
    self.log({"event": "fault", "kind": "sync_crash", "fault": f.describe(), "merges": sync.merges})
    rt.epochs[SYNC] += 1
    self.sync_up, rt.sync = False, None
    for machine in rt.machines:
      machine.sync_lost()
    rt.push(back, FAULT, "sync_restart", None, background=True)

  def on_sync_restart(self, _) -> None:
    rt = self.runtime
    restarts = len(self.stats.restarts)
    rt.sync = rt.recovery.restore_sync(self.make_sync, generation=restarts)
    self.sync_up = True
    record = self.stats.restarts[-1]
    record["restored"] = rt.sync.merges
    self.log(
        {
            "event": "sync_restart",
            "generation": restarts,
            "merges": rt.sync.merges,
            "merges_lost": record["merges"] - rt.sync.merges,
        }
    )
    for m in range(len(rt.learners)):
      if self.up[m]:  # join it, and send again every unanswered upload, computed afresh
        rt.decide(m, rt.machines[m].sync_restarted())

  def _shard_crash(self, f: chaos.Fault) -> None:
    """Shard f.shard alone loses its memory (open rounds, messages on their way to it); the
    other shards merge on. It comes back from the run's newest checkpoint of the shards."""
    rt = self.runtime
    s, sync = f.shard, rt.sync
    self.stats.faults["sync_crash"] += 1
    self.stats.merges_skipped += sum(1 for pending in sync.shards[s].pending if pending)
    self.stats.restarts.append(
        {"time": rt.now, "back": rt.now + f.duration_s, "merges": sync.merges, "shard": s}
        | {"restored": None, "mode": f.mode}
    )
    self.log({"event": "fault", "kind": "sync_crash", "fault": f.describe(), "shard": s})
    restarts = sum(r.get("shard") == s for r in self.stats.restarts)
    sync.crash(s, rt.recovery.restore_shard(self.make_sync, s, generation=restarts))
    rt.push(rt.now + f.duration_s, FAULT, "shard_restart", s, background=True)

  def on_shard_restart(self, s: int) -> None:
    rt = self.runtime
    rt.sync.revive(s)
    shard = rt.sync.shards[s]
    record = [r for r in self.stats.restarts if r.get("shard") == s][-1]
    record["restored"] = rt.sync.merges
    self.log(
        {"event": "sync_restart", "shard": s, "generation": shard.generation}
        | {"merges": rt.sync.merges, "merges_lost": record["merges"] - rt.sync.merges}
    )
    fragments = rt.sync.fragments_of(s)
    for m in range(len(rt.learners)):
      if self.up[m]:  # join it, and send again its fragments' unanswered uploads
        rt.decide(m, rt.machines[m].shard_restarted(fragments))

  def checkpoint(self, action: protocol.Checkpoint) -> bool:
    """A 'save' crash due dies in the middle of this checkpoint write."""
    if self._crash_on_save is None:
      return False
    f, self._crash_on_save = self._crash_on_save, None
    try:
      self.runtime.recovery.save_sync(self.runtime.sync, interrupt=True)
    except sync_checkpoint.SimulatedCrash:
      pass
    self._sync_crash(f)
    return True

  def handle(self, event: protocol.Event) -> None:
    """The synchronizer consumes `event`: a Join's answer is read at once (a crash on save in
    the actions must not lose it), the taints followed, then the actions carried out."""
    rt = self.runtime
    actions = rt.sync.handle(event)
    decisions = []
    if isinstance(event, protocol.Join):
      decisions = rt.join_answered(event.learner, actions)
    self.taints.handled(event, actions)
    rt.act(actions)
    if decisions:
      rt.decide(event.learner, decisions)

  # ---- steps ----

  def duration(self, m: int, seconds: float) -> float:
    duration = self.layer.stretch(m, self.runtime.now, seconds)
    self._step[m] = (self.runtime.now, duration)
    return duration

  def stepped(self, m: int, seconds: float, saved: bool) -> None:
    self._step[m] = None
    if saved:
      self._since_ckpt[m] = [0, 0.0]
    else:
      self._since_ckpt[m][0] += 1
      self._since_ckpt[m][1] += seconds

  # ---- messages: virtual_faults.FaultyMessages; what a learner does on arrival ----

  def send_up(self, m: int, message: virtual_hooks.Message, delay: float):
    if not self.sync_up:  # unanswered uploads are sent again at the restart
      return None
    return self.messages.send_up(m, message, delay)

  def send_down(self, send: protocol.Send, delay: float):
    return self.messages.send_down(send, delay)

  def on_heal(self, m: int) -> None:
    self.messages.heal(m)

  def arrived(self, send: protocol.Send, decisions: list) -> None:
    drop = decisions[0] if isinstance(decisions[0], learner_machine.Drop) else None
    self.taints.arrived_down(send, drop.code if drop is not None else None)
    if drop is not None:
      self.stats.refused_by_learners[drop.code.value] += 1

  def learner_up(self, m: int) -> bool:
    return self.up[m]

  def finish(self) -> None:
    """Brings a synchronizer still down back from its checkpoint (to evaluate and save it);
    gives the tainted messages still pending or on their way their fate; counts the faults
    still armed."""
    rt = self.runtime
    if not self.sync_up:
      for record in self.crashes.rejoining.values():  # back, but nobody to rejoin
        record["sync_down_at_end"] = True
      rt.sync = rt.recovery.restore_sync(self.make_sync, generation=len(self.stats.restarts))
      self.sync_up = True
      self.stats.restarts[-1]["restored"] = rt.sync.merges
    self.taints.finish()
    self.stats.unused += self.layer.unused + (self._crash_on_save is not None)
