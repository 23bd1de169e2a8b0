"""The virtual runtime with a fault schedule applied (see diloco/chaos.py for the faults).

- crash learner m: its memory is lost (state, counters, its data position since its checkpoint);
  events addressed to it are dropped (its epoch moves on); the synchronizer gets Leave(m) at once.
  Work since its last checkpoint, and the step it was in, are wasted. When it comes back it restores
  its checkpoint (or starts over, see recovery.py) and re-joins with the versions it holds; the
  rejoin is complete once every fragment the synchronizer sent in answer has arrived (a learner that
  started over trains only from then on).
- sync_crash: the synchronizer's memory is lost (open rounds, timers, messages in flight to it);
  learners keep training and keep their unanswered uploads; it restarts from its newest checkpoint
  as a new generation, every live learner re-joins and sends again each fragment still unanswered,
  computed afresh. Mode 'save': it dies during its next checkpoint write instead.
- straggle multiplies a learner's step times; delay adds latency to messages sent in the window
  (both ways); partition holds them to the end of the window ('hold') or drops them ('drop': the
  sender learns of it, a learner waiting for the lost answer stops waiting, and the learner re-joins
  when the partition ends to be sent what it missed).
- corrupt flips bits in the next payload after its checksum; poison replaces the next upload by
  NaN/Inf/huge values at the source. Each tainted message is followed to its fate: rejected
  (by reason), merged (a failure of the checks), superseded, or lost.

A learner that receives a Send it cannot apply (`Learner.accepts`: corrupt, or a gap after lost
messages) drops it and re-joins (at most one Join of its in flight); so does one whose upload is
refused for its base version. Faults are background events: they do not keep a finished run alive,
and faults after the token budget is spent are ignored.
"""

import collections
import dataclasses
from typing import Any

import numpy as np

from diloco import chaos, protocol, sync_checkpoint
from diloco.learner import Learner
from diloco.runtime import virtual
from diloco.runtime.virtual import AT_LEARNER, AT_SYNC, FAULT, START, SYNC

RESYNC_CODES = ("unknown_base_version", "stale", "duplicate")  # its base is off: re-join
MERGE_TIME_CODES = ("non_finite", "outlier")  # rejections of uploads already in a round


@dataclasses.dataclass
class ChaosStats:
    """What the faults did; `multi` turns it into summary keys."""

    faults: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ignored: int = 0  # faults that found nothing to act on (e.g. a crash of a learner down)
    unused: int = 0  # taints and 'save' crashes still armed at the end
    crashes: list = dataclasses.field(default_factory=list)  # {learner, time, back, rejoined...}
    restarts: list = dataclasses.field(default_factory=list)  # {time, back, restored, lost}
    merges_skipped: int = 0
    resyncs: int = 0
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    refused_by_learners: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    tainted: dict = dataclasses.field(default_factory=dict)  # kind -> Counter of fates
    steps_lost: list = dataclasses.field(default_factory=list)

    def fate(self, kind: str, outcome: str) -> None:
        self.tainted.setdefault(kind, collections.Counter())[outcome] += 1


class ChaosRuntime(virtual.VirtualRuntime):
    """VirtualRuntime plus faults; needs a `recovery.Recovery` and a synchronizer factory."""

    def __init__(self, *args, faults: list[chaos.Fault], make_sync, seed: int,
                 on_chaos=lambda record: None, **kwargs):
        super().__init__(*args, **kwargs)
        if self.recovery is None:
            raise ValueError("a chaos run needs checkpoints and restarts (a Recovery)")
        n = len(self.learners)
        self.faults, self.make_sync, self.on_chaos = list(faults), make_sync, on_chaos
        self.rng = np.random.default_rng([seed, 0xC4A05])
        self.stats = ChaosStats(steps_lost=[0] * n)
        self.up = [True] * n
        self.sync_up = True
        self._step = [None] * n  # (start, duration) of the step in progress
        self._since_ckpt = [[0, 0.0] for _ in range(n)]  # steps, busy seconds since a checkpoint
        self._taints: list[list[chaos.Fault]] = [[] for _ in range(n)]
        self._crash_on_save: chaos.Fault | None = None
        self._join_inflight = [False] * n
        self._last_join = [-1.0] * n  # when learner m last sent a Join
        self._rejoin: dict[int, dict] = {}  # learner -> its crash record, until rejoined
        self._heals: set = set()
        self._tainted_up: dict[tuple, str] = {}  # (m, p, sent_time) -> kind, on the wire
        self._taint_pending: dict[tuple, tuple] = {}  # (m, p) -> (key, kind) pending at the sync
        self._tainted_down: dict[int, tuple[str, Any]] = {}  # id(send) -> (kind, send)

    # ---- the loop ----

    def run(self) -> float:
        for i, f in enumerate(self.faults):
            self._push(f.time_s, FAULT, "fault", i, background=True)
        return super().run()

    def _budget_left(self) -> bool:
        return self.tokens_started + min(l_.tokens_per_step for l_ in self.learners) <= self.budget

    def _more(self) -> bool:
        down = not self.sync_up or not all(self.up)
        return super()._more() or (down and bool(self._queue) and self._budget_left())

    def _log(self, record: dict) -> None:
        self.on_chaos({"time": self.now, **record})

    def _on_fault(self, i: int) -> None:
        f = self.faults[i]
        m = f.learner
        if not self._budget_left():
            self.stats.ignored += 1
            return
        if f.kind == "crash":
            if self.up[m]:
                return self._crash(m, f)
        elif f.kind == "sync_crash":
            if self.sync_up and f.mode == "now":
                return self._sync_crash(f)
            if self.sync_up and self._crash_on_save is None:
                self._crash_on_save = f  # counted when it fires
                return
        elif f.kind in ("corrupt", "poison"):
            self._taints[m].append(f)  # counted when a message carries it
            return
        else:  # straggle, delay, partition: looked up by time when steps and messages happen
            self.stats.faults[f.kind] += 1
            self._log({"event": "fault", "kind": f.kind, "learner": m, "fault": f.describe()})
            return
        self.stats.ignored += 1

    def _active(self, m: int, kind: str) -> list[chaos.Fault]:
        return [f for f in self.faults if f.kind == kind and f.learner == m and f.active(self.now)]

    # ---- learner crash and rejoin ----

    def _crash(self, m: int, f: chaos.Fault) -> None:
        self.stats.faults["crash"] += 1
        self._epochs[m] += 1
        self.up[m] = False
        clock, learner = self.clocks[m], self.learners[m]
        lost_steps, wasted = self._since_ckpt[m]
        if self._step[m] is not None:  # the step in progress never finishes
            start, duration = self._step[m]
            clock.busy_s -= start + duration - self.now
            wasted += self.now - start
            lost_steps += 1
            self.tokens_started -= learner.tokens_per_step
        clock.wasted_s += wasted
        self.stats.steps_lost[m] += lost_steps
        if clock.waiting_since is not None:
            clock.idle_s += self.now - clock.waiting_since
            clock.waiting_since = None
        clock.inflight.clear()
        self._step[m], self._since_ckpt[m] = None, [0, 0.0]
        self._join_inflight[m] = False
        learner.state = None  # its memory is gone; recovery builds a new learner
        record = {"learner": m, "time": self.now, "back": f.end_s, "rejoined": None,
                  "restored_step": None, "steps_lost": lost_steps}
        self.stats.crashes.append(record)
        self._rejoin[m] = record
        self._log({"event": "fault", "kind": "crash", "learner": m, "fault": f.describe(),
                   "steps_lost": lost_steps})
        if self.sync_up:
            self._handle(protocol.Leave(m, self.now))
        self._push(f.end_s, FAULT, "recover", m, background=True)

    def _on_recover(self, m: int) -> None:
        learner, step = self.recovery.restore_learner(m)
        self.learners[m] = learner
        self.up[m] = True
        clock = self.clocks[m]
        clock.inflight.clear()
        clock.waiting_since, clock.done = None, False
        record = self._rejoin[m]
        record["restored_step"] = step
        self._log({"event": "recover", "learner": m, "restored_step": step})
        if self.sync_up:
            self._join(m)
        if step is not None:  # trains on its checkpoint while the newer fragments come in
            self._push(self.now, START, "start", m, owner=m)

    def _join(self, m: int) -> None:
        learner = self.learners[m]
        self._join_inflight[m] = True
        self._last_join[m] = self.now
        self._send_up(m, protocol.Join(m, self.now, tuple(learner.versions),
                                       tuple(learner.generations)))

    def _resync(self, m: int) -> None:
        if self.up[m] and self.sync_up and not self._join_inflight[m]:
            self.stats.resyncs += 1
            self._join(m)

    def _rejoined(self, m: int) -> None:
        record = self._rejoin.pop(m)
        record["rejoined"] = self.now
        self._log({"event": "rejoin", "learner": m, "down_s": self.now - record["time"],
                   "to_rejoin_s": self.now - record["back"]})
        if record["restored_step"] is None:  # started over: trains from the global parameters
            self._push(self.now, START, "start", m, owner=m)

    # ---- synchronizer crash and restart ----

    def _sync_crash(self, f: chaos.Fault) -> None:
        self.stats.faults["sync_crash"] += 1
        sync = self.sync
        open_rounds = sum(1 for pending in sync.pending if pending)
        self.stats.merges_skipped += sync.rounds_skipped + open_rounds
        for key, kind in self._taint_pending.values():
            self.stats.fate(kind, "lost")
        self._taint_pending.clear()
        back = self.now + f.duration_s  # a 'save' crash fires after its scheduled time
        self.stats.restarts.append({"time": self.now, "back": back, "merges": sync.merges,
                                    "restored": None, "mode": f.mode})
        self._log({"event": "fault", "kind": "sync_crash", "fault": f.describe(),
                   "merges": sync.merges})
        self._epochs[SYNC] += 1
        self.sync_up, self.sync = False, None
        self._join_inflight = [False] * len(self.learners)
        self._push(back, FAULT, "sync_restart", None, background=True)

    def _on_sync_restart(self, _) -> None:
        restarts = len(self.stats.restarts)
        self.sync = self.recovery.restore_sync(self.make_sync, generation=restarts)
        self.sync_up = True
        record = self.stats.restarts[-1]
        record["restored"] = self.sync.merges
        self._log({"event": "sync_restart", "generation": restarts, "merges": self.sync.merges,
                   "merges_lost": record["merges"] - self.sync.merges})
        for m, learner in enumerate(self.learners):
            if not self.up[m]:
                continue
            self._join(m)
            clock = self.clocks[m]
            for p in sorted(clock.inflight):  # unanswered uploads: send again, computed afresh
                if learner.c_steps[p] > 0 and learner.versions[p] >= 0:
                    self._send_up(m, learner.upload(p, sent_time=self.now, arrival_time=0.0,
                                                    step_time=clock.step_s))
                else:
                    clock.inflight.pop(p)

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
        duration = super()._duration(m)
        for f in self._active(m, "straggle"):
            duration *= f.factor
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

    # ---- messages ----

    def _link(self, m: int, nbytes: int) -> tuple[float | None, chaos.Fault | None]:
        """Arrival time of a message of learner m's link sent now (None: dropped), and the
        partition that dropped or held it."""
        arrival = self.now + self.net.delay(nbytes) + sum(f.factor for f in self._active(m,
                                                                                         "delay"))
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

    def _send_up(self, m: int, message: protocol.Upload | protocol.Join) -> None:
        is_upload = isinstance(message, protocol.Upload)
        if not self.sync_up:  # unanswered uploads are sent again at the restart
            return
        arrival, dropped = self._link(m, message.nbytes if is_upload else 0)
        if arrival is None:
            self.stats.dropped["up"] += 1
            if is_upload:
                self.clocks[m].inflight.pop(message.fragment, None)  # the sender learns of it
                if self.clocks[m].waiting_since is not None:
                    self._push(self.now, START, "start", m, owner=m)
            else:
                self._join_inflight[m] = False
            return
        kind = None
        if is_upload and self._taints[m]:
            f = self._taints[m].pop(0)
            if f.kind == "poison":
                message = dataclasses.replace(message, delta=chaos.poison(message.delta, f.mode,
                                                                          f.factor), checksum=None)
            elif f.mode == "up":
                message = dataclasses.replace(message, delta=chaos.flip_bits(message.delta,
                                                                             self.rng))
            else:
                self._taints[m].insert(0, f)  # waits for the next download
                f = None
            if f is not None:
                kind = f"{f.kind}_{f.mode}"
                self._count_taint(f, m)
        if is_upload:
            self.bytes_up[m] += message.nbytes
        message = dataclasses.replace(message, time=arrival)
        if kind is not None:
            self._tainted_up[(m, message.fragment, message.sent_time)] = kind
        self._push(arrival, AT_SYNC, "at_sync", message, owner=SYNC)

    def _count_taint(self, f: chaos.Fault, m: int) -> None:
        self.stats.faults[f.kind] += 1
        self.stats.fate(f"{f.kind}_{f.mode}", "sent")
        self._log({"event": "fault", "kind": f.kind, "learner": m, "fault": f.describe()})

    def _send_down(self, send: protocol.Send) -> None:
        m = send.learner
        if not self.up[m]:
            self.stats.dropped["down"] += 1
            return
        arrival, dropped = self._link(m, send.nbytes)
        if arrival is None:
            self.stats.dropped["down"] += 1
            return
        taint = next((f for f in self._taints[m] if f.kind == "corrupt" and f.mode == "down"), None)
        if taint is not None:
            self._taints[m].remove(taint)
            payload = chaos.flip_bits(send.update if send.update is not None else send.values,
                                      self.rng)
            send = dataclasses.replace(send, **{"update" if send.update is not None else "values":
                                                payload})
            self._count_taint(taint, m)
            self._tainted_down[id(send)] = ("corrupt_down", send)
        self.bytes_down[m] += send.nbytes
        self._push(arrival, AT_LEARNER, "at_learner", send, owner=m)

    def _on_at_learner(self, send: protocol.Send) -> None:
        m = send.learner
        learner = self.learners[m]
        tainted = self._tainted_down.pop(id(send), None)
        reason = learner.accepts(send)
        if tainted is not None:
            self.stats.fate(tainted[0], f"refused ({reason})" if reason else "applied")
        if reason is not None:
            self.stats.refused_by_learners[reason] += 1
            if reason in ("checksum", "gap"):
                self._resync(m)
            return
        super()._on_at_learner(send)
        record = self._rejoin.get(m)
        if record is not None and record.get("waiting") is not None:
            record["waiting"].discard(send.fragment)
            if not record["waiting"]:
                self._rejoined(m)

    def _on_at_sync(self, event: protocol.Event) -> None:
        self._handle(event)

    def _on_timer(self, _) -> None:
        self._handle(protocol.Tick(self.now))

    def _handle(self, event: protocol.Event) -> None:
        """The synchronizer consumes `event`; its actions are followed, then carried out."""
        actions = self.sync.handle(event)
        rejoining = None
        if isinstance(event, protocol.Join):
            m = event.learner
            self._join_inflight[m] = False
            if m in self._rejoin and self.up[m]:
                rejoining = self._rejoin[m]
                rejoining["waiting"] = {a.fragment for a in actions
                                        if isinstance(a, protocol.Send) and a.learner == m}
        if isinstance(event, protocol.Upload):
            self._follow_upload(event, actions)
        self._follow_merges(actions)
        self._act(actions)
        if rejoining is not None and not rejoining["waiting"]:
            self._rejoined(event.learner)

    def _on_reject(self, record: dict) -> None:
        super()._on_reject(record)
        m = record["learner"]
        # A Join sent with or after the upload already reported the versions it was based on.
        if record.get("code") in RESYNC_CODES and record["sent_time"] > self._last_join[m]:
            self._resync(m)

    # ---- following tainted uploads ----

    def _follow_upload(self, up: protocol.Upload, actions: list[protocol.Action]) -> None:
        key = (up.learner, up.fragment, up.sent_time)
        kind = self._tainted_up.pop(key, None)
        reject = next((a.record for a in actions if isinstance(a, protocol.Log)
                       and a.record["event"] == "reject" and a.record.get("sent_time") == key[2]
                       and (a.record["learner"], a.record["fragment"]) == key[:2]), None)
        if reject is None or reject["code"] in MERGE_TIME_CODES:  # it entered the round
            old = self._taint_pending.pop(key[:2], None)
            if old is not None:
                self.stats.fate(old[1], "superseded")
        if reject is not None:
            if kind is not None:
                self.stats.fate(kind, f"rejected ({reject['code']})")
        elif kind is not None:
            self._taint_pending[key[:2]] = (key, kind)

    def _follow_merges(self, actions: list[protocol.Action]) -> None:
        for a in actions:
            if not isinstance(a, protocol.Log):
                continue
            r = a.record
            if r["event"] == "merge":
                for m in r["learners"]:
                    pending = self._taint_pending.pop((m, r["fragment"]), None)
                    if pending is not None:
                        self.stats.fate(pending[1], "merged")
            elif r["event"] == "reject" and "sent_time" in r:
                key = (r["learner"], r["fragment"])
                pending = self._taint_pending.get(key)
                if pending is not None and pending[0][2] == r["sent_time"]:
                    del self._taint_pending[key]
                    self.stats.fate(pending[1], f"rejected ({r['code']})")

    def finish(self) -> None:
        """Brings a synchronizer still down back from its checkpoint (to evaluate and save it)."""
        if not self.sync_up:
            for record in self._rejoin.values():  # back, but nobody to rejoin
                record["sync_down_at_end"] = True
            self.sync = self.recovery.restore_sync(self.make_sync, generation=len(
                self.stats.restarts))
            self.sync_up = True
            self.stats.restarts[-1]["restored"] = self.sync.merges
        super().finish()
        for key, kind in self._taint_pending.values():
            self.stats.fate(kind, "pending at the end")
        for kind in self._tainted_up.values():
            self.stats.fate(kind, "lost")
        for kind, _ in self._tainted_down.values():
            self.stats.fate(kind, "lost")
        self.stats.unused += sum(len(t) for t in self._taints) + (self._crash_on_save is not None)
