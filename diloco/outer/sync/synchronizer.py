"""The synchronizer core: a sans-I/O state machine (no threads, sockets, clocks or sleeps).

It holds, per fragment p, one record (sync_state.FragmentState): the global values Θ_p, the outer
optimizer state, the downlink residual and a version. It consumes events (protocol.Join/Leave/
Upload/Tick) and returns actions (protocol.Send/SetTimer/Log).
Every runtime drives the same object, so a bug found in simulation is the bug in production.

Merge of fragment p (its round: rounds.py): once `policy.quorum` uploads of p from live learners
are in, wait the grace window (cut short when every live learner has uploaded), then merge every
pending upload of p with `policy.weights` and `policy.merge`, step the outer optimizer, and send
version v+1 to every live learner (or to its contributors only, `policy.broadcast`; with DyLU each
Send carries the learner's inner steps, policies.Dylu). The update Θ_new − Θ_old is sent encoded with
the downlink codec, and the synchronizer itself applies the decoded update, so learners and
synchronizer hold bit-identical fragments; the quantisation error is fed back into the next
update of that fragment (error feedback).

Everything that arrives is checked before it can touch the state (`admission`: the checksum, the
fragment, the model's paths, shapes and sizes, the base version, progress; then at merge time
`_screen`: finite values and, with an `integrity.OutlierScreen`, the norm). A rejection is a
`protocol.Refused` action (learner, fragment, `outcomes.Code`, reason; its `record` the 'reject'
log line) and leaves the durable state as it was. Unless the payload was corrupted in transit (a
checksum mismatch: sent again), the round stops waiting for that learner; a learner that joins in
a round's middle is not waited for either, unless the quorum counts every member
(`Quorum.of_members`). Non-finite values and outliers are found at merge time, after the upload
fed the timing EMAs behind the grace window.

Merges are atomic (`commit.outer_step`): a round whose merge, outer step or downlink would
overflow float32 is rejected whole (`non_finite_merge`), the state as before; `handle` never raises.

Restarts: `state_dict()` is everything that must survive a crash (globals, outer optimizer states,
versions, downlink residuals, EMAs, outlier history, generation history); `restart(state, g)` loads
it and begins generation g. Who is live, what each learner holds and uploads not yet merged are
rebuilt from learners' Joins and new uploads. With `checkpoint_every=N` a `Checkpoint` action asks
the runtime to save the state after every N-th merge.

When a round merges and how large its outer step is are the merge clock's (`policy.merge_clock`,
`policy.merge_scale`; merge_clock.py): by arrival (above) or once per period of the learners'
reference pace, each merge one outer step or its share of a full round's tokens. Every merge's
log line names the clock, the share and the period.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from diloco.outer import fragments, integrity, merging, policies, protocol
from diloco.outer.codecs import compression
from diloco.outer.sync import admission, commit, merge_clock, ownership, rounds, screening, sync_state
from diloco.outer.outcomes import Code
from diloco.outer.protocol import Action, Event, Join, Leave, Log, Send, SetTimer, Tick, Upload

NON_FINITE = screening.NON_FINITE


class RestartWindow:
  """The restart window of asynchronous Local-SGD as its authors' toy runs it
  (`policy.restart_window_s`): a merge's contributors are not answered at once. The first of a
  window sets its end, window_s later; every contributor merged until then waits too. At the end,
  or as soon as every live learner waits, all of them are sent the newest version of what they
  wait for and restart together. It names who is due and asks for a timer."""

  def __init__(self, window_s: float):
    if not window_s > 0:
      raise ValueError(f"restart window must be > 0 s, got {window_s}")
    self.window_s = window_s
    self.waiting: dict[int, dict[int, tuple | None]] = {}  # learner -> fragment -> own key
    self.release_s: float | None = None

  def hold(self, learners, p: int, own: dict, now: float) -> list[SetTimer]:
    """Holds back fragment p's answer to `learners` (`own`: learner -> its merged upload's key);
    the timer of a window this opens."""
    for m in learners:
      self.waiting.setdefault(m, {})[p] = own.get(m)
    if self.release_s is not None:
      return []
    self.release_s = now + self.window_s
    return [SetTimer(self.release_s)]

  def drop(self, learner: int) -> None:
    """A learner that left waits no more."""
    self.waiting.pop(learner, None)

  def release(self, now: float, live: set[int]) -> list[tuple[int, int, tuple | None]]:
    """(learner, fragment, own key) to answer now: all held, once the window has ended or every
    live learner waits; else none."""
    if self.release_s is None or (now < self.release_s and not live <= set(self.waiting)):
      return []
    waiting, self.waiting, self.release_s = self.waiting, {}, None
    return [
        (m, p, key) for m in sorted(waiting) if m in live for p, key in sorted(waiting[m].items())
    ]


class Synchronizer:
  """Global fragments, outer optimizer states and versions; merges by a policy."""

  def __init__(
      self,
      params: Mapping[str, np.ndarray],
      frag: fragments.Fragmentation,
      policy: policies.Policy,
      outer_tx: optax.GradientTransformation,
      downlink_codec: str = "fp32",
      *,
      screen: integrity.OutlierScreen | None = None,
      checkpoint_every: int = 0,
      owned: Sequence[int] | None = None,
  ):
    if downlink_codec not in compression.CODECS:
      raise ValueError(f"unknown downlink codec {downlink_codec!r}")
    if checkpoint_every < 0:
      raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
    self.screen, self.checkpoint_every = screen, checkpoint_every
    flat = fragments.flatten(params)
    frag.check(flat)
    self.frag, self.policy, self.tx, self.codec = frag, policy, outer_tx, downlink_codec
    self._cpu = jax.devices("cpu")[0]
    num = frag.num_fragments
    self.owned = ownership.checked_owned(owned, num)
    with jax.default_device(self._cpu):
      self.fragments = {  # each owned fragment's durable state
          p: sync_state.FragmentState.fresh(
              {k: np.array(flat[k], np.float32) for k in frag.paths[p]}, outer_tx
          )
          for p in self.owned
      }
    self.generation = 0
    self.lineage: dict[int, list[int]] = {}  # earlier generation -> versions shared with ours
    self.rms: list[float] = []  # recent finite Δ norm / sqrt(values), any fragment
    self.members: set[int] = set()
    self.rounds_skipped = 0  # rounds that had uploads but ended with every one rejected
    self.live: set[int] = set()
    self.held: dict[int, list[int]] = {}  # fragment versions each learner was sent
    self.held_gen: dict[int, list[int]] = {}  # ... and their generations
    self.rounds = {p: rounds.Round() for p in self.owned}  # each fragment's round in progress
    self.ema_step, self.ema_quorum, self.ema_sync = (policies.Ema(policy.ema_decay) for _ in "sqs")
    steps, window_s = policy.dylu_inner_steps, policy.restart_window_s
    self.dylu = policies.Dylu(steps, policy.ema_decay) if steps else None
    # asynchronous Local-SGD's restart window
    self.window = RestartWindow(window_s) if window_s > 0 else None
    self.clock = merge_clock.MergeClock.of(
        policy.merge_clock, policy.merge_scale, policy.clock_steps, policy.ema_decay, self.owned
    )

  # ---- events ----

  def handle(self, event: Event) -> list[Action]:
    """Consumes one event and returns what should happen next."""
    if isinstance(event, Upload):
      return self._upload(event)
    if isinstance(event, Tick):
      return self._tick(event.time)
    if isinstance(event, Join):
      return self._join(event)
    if isinstance(event, Leave):
      self.live.discard(event.learner)
      if self.window is not None:
        self.window.drop(event.learner)
      out = [a for p in self.owned for a in self._maybe_merge(p, event.time)]
      return out + self._maybe_release(event.time)
    raise TypeError(f"unknown event {event!r}")

  def finished(self, learner: int, now: float) -> list[Action]:
    """`learner` trains no more and has nothing unanswered (its heartbeat says finished). A
    round open without its upload whose quorum needs every learner it counts would wait for it
    forever (a synchronous run whose learners were told to leave at different steps: one left
    mid-period, the other's last upload waited for it): the learner abstains from such rounds
    until it uploads again. A round that can merge without it (K below the learners counted)
    is left to its quorum and grace window."""
    waiting = []
    for p, rnd in self.rounds.items():
      group = self._group(rnd)
      if rnd.pending and learner in group - set(rnd.pending):
        if self.policy.quorum.required(len(group)) >= len(group):
          waiting.append(p)
    if waiting:
      self.clock.resume(now)
    for p in waiting:
      self.rounds[p].abstaining.add(learner)
    return [a for p in waiting for a in self._maybe_merge(p, now)]

  def _group(self, rnd: rounds.Round) -> set[int]:
    """The learners a round counts: its quorum's (members or live), less those abstaining."""
    return (self.members if self.policy.quorum.of_members else self.live) - rnd.abstaining

  def _join(self, event: Join) -> list[Action]:
    refused = admission.invalid_join(event, self.frag.num_fragments)
    if refused is not None:
      return [refused]
    self.clock.resume(event.time)
    gens = tuple(event.generations) or (self.generation,) * self.frag.num_fragments
    returning = event.learner not in self.live  # not a live learner asking for a resync
    self.live.add(event.learner)
    self.members.add(event.learner)
    self.held[event.learner] = list(event.versions)
    self.held_gen[event.learner] = list(gens)
    actions: list[Action] = [Log({"event": "join", "learner": event.learner, "time": event.time})]
    for p in self.owned:
      v, g = event.versions[p], gens[p]
      known = admission.known(self._history(), p, g, v)
      if v != self.fragments[p].version or not known:
        actions.append(
            self._send(event.learner, p, own=self._unseen_own(event.learner, p, v, known))
        )
    # Rounds in progress do not wait for a learner that (re)joins in their middle, unless the
    # quorum counts every member (synchronous DiLoCo without elasticity waits for it).
    late = [
        p
        for p in self.owned
        if returning
        and not self.policy.quorum.of_members
        and self.rounds[p].pending
        and event.learner not in self.rounds[p].pending
    ]
    for p in late:
      self.rounds[p].abstaining.add(event.learner)
    return actions + [a for p in late for a in self._maybe_merge(p, event.time)]

  def _upload(self, up: Upload) -> list[Action]:
    invalid = admission.invalid(up, self.fragments, self._history(), self.policy.max_staleness)
    if invalid:
      reject = admission.refusal(up.learner, up.fragment, up.time, invalid[1], invalid[0], up)
      if invalid[0] in (Code.UNKNOWN_FRAGMENT, Code.CHECKSUM):
        return [reject]  # corrupted on the way: the learner is expected to send it again
      # Sending it again would not help: the round does not wait for that learner any more.
      self.rounds[up.fragment].abstaining.add(up.learner)
      return [reject] + self._maybe_merge(up.fragment, up.time)
    self.clock.resume(up.time)
    p, rnd = up.fragment, self.rounds[up.fragment]
    if self.policy.anchor == "global":
      up = policies.anchored(up, self.fragments[p].values)
    rnd.abstaining.discard(up.learner)
    self.ema_step.update(up.step_time)
    if self.dylu is not None:
      self.dylu.observe(up.learner, up.step_time)
    self.clock.pace.observe(up)
    self.ema_sync.update(2.0 * max(up.time - up.sent_time, 0.0))  # up and back down
    if not rnd.pending:
      rnd.first_upload_s = up.time
    rnd.pending[up.learner] = up
    return self._maybe_merge(p, up.time)

  def _tick(self, now: float) -> list[Action]:
    self.clock.resume(now)
    actions: list[Action] = []
    for p, rnd in self.rounds.items():
      if rnd.deadline_s is not None and rnd.deadline_s <= now:
        actions += self._merge(p, now)
      elif rnd.deadline_s is None and rnd.wake_s is not None and rnd.wake_s <= now:
        actions += self._maybe_merge(p, now)  # the period clock's scheduled merge
    return actions + self._maybe_release(now)

  # ---- merging ----

  def _maybe_merge(self, p: int, now: float) -> list[Action]:
    rnd = self.rounds[p]
    group = self._group(rnd)
    emas = (self.ema_step, self.ema_quorum, self.ema_sync)
    step = rounds.advance(rnd, group, self.policy, now, *emas, due=self.clock.due_at(p))
    if step is rounds.MERGE:
      return self._merge(p, now)
    return [step] if step is not None else []

  def _screen(self, p: int, now: float) -> tuple[list[Upload], list[dict], list[Action], set[int]]:
    """Pending uploads of p with their decoded deltas (clipped ones scaled down), less
    outliers and, when the outlier screen is on, non-finite ones (`_merge` finds those
    otherwise); the rejections, and the learners whose deltas were clipped."""
    pending = self.rounds[p].pending
    ups = [pending[m] for m in sorted(pending)]
    rejected: dict[int, tuple[Code, str]] = {}
    f, clipped = self.fragments[p], set()
    deltas = [compression.Decoded(u.delta) for u in ups]  # each leaf decoded as it is merged
    if self.screen is not None:
      deltas, rejected, scaled, f.norms, self.rms = screening.screened(
          deltas, f.values, self.screen, f.norms, self.rms, [u.steps for u in ups]
      )
      clipped = {ups[i].learner for i in scaled}
    return (*self._drop(p, now, ups, deltas, rejected), clipped)

  def _drop(
      self,
      p: int,
      now: float,
      ups: list[Upload],
      deltas: list[dict],
      rejected: dict[int, tuple[Code, str]],
  ) -> tuple[list[Upload], list[dict], list[Action]]:
    """Rejects uploads `rejected` (index -> (code, reason)); the others and the rejections."""
    rejects: list[Action] = [
        admission.refusal(ups[i].learner, p, now, rejected[i][1], rejected[i][0], ups[i])
        for i in sorted(rejected)
    ]
    for i in rejected:
      del self.rounds[p].pending[ups[i].learner]
    keep = [i for i in range(len(ups)) if i not in rejected]
    return [ups[i] for i in keep], [deltas[i] for i in keep], rejects

  def _merge(self, p: int, now: float) -> list[Action]:
    """Ends fragment p's round: screen, combine, commit, then tell the learners."""
    history = (list(self.fragments[p].norms), list(self.rms))  # restored if the round fails
    ups, deltas, rejects, clipped = self._screen(p, now)
    ups, merged, weights, more = self._combine(p, now, ups, deltas)
    rejects += more
    if not ups:
      self.rounds_skipped += 1
      self.rounds[p] = rounds.Round()
      return rejects
    staleness = [self.fragments[p].version - u.base_version for u in ups]
    if self.policy.anchor == "global":  # each taken against the fragment as it is
      staleness = [0] * len(ups)
    if self.policy.staleness_damping:
      merged = merging.staleness_damped(merged, weights, staleness)
    share = self.clock.share([u.tokens for u in ups], self.live, self.policy.quorum)
    encoded = self._commit(p, ups, merged, share)
    if isinstance(encoded, str):  # nothing was committed: drop the round
      self.fragments[p].norms, self.rms = history
      return rejects + self._reject_round(p, now, ups, encoded)
    version, rnd = self.fragments[p].version, self.rounds[p]
    period_s = self.clock.period_s(self.live, self.policy.quorum, self.ema_step.get())
    due = self.clock.due_at(p)
    self.clock.merged(p, now, rounds.on_time(rnd), period_s)
    record = rounds.merge_record(p, now, version, rnd.quorum_s, ups, weights, staleness, clipped)
    record.update(clock=self.clock.clock, scale=share, period_s=period_s, due_s=due)
    self.rounds[p] = rounds.Round()
    return rejects + [Log(record)] + self._broadcast(p, ups, encoded, now)

  def _combine(self, p: int, now: float, ups: list[Upload], deltas: list[dict]):
    """The weighted merge of the screened uploads, leaving out any whose values make it
    non-finite (a non-finite contribution never reaches the global state): (the uploads
    merged, the merged outer gradient, their weights, the rejections)."""
    rejects: list[Action] = []
    merged, weights = None, None
    while ups:
      weights = self.policy.weights([u.tokens for u in ups], [u.steps for u in ups])
      merged, bad = self.policy.merge(deltas, weights)
      if not bad:
        break
      ups, deltas, more = self._drop(p, now, ups, deltas, {i: NON_FINITE for i in bad})
      rejects += more
    return ups, merged, weights, rejects

  def _commit(self, p: int, ups: list[Upload], merged: dict, share: float = 1.0):
    """The outer step of fragment p (`share` of one), whole or not at all
    (`commit.outer_step`): version v+1 and its encoded update, or why nothing was committed (a
    str)."""
    f = self.fragments[p]
    with jax.default_device(self._cpu):
      step = commit.outer_step(
          self.tx, merged, f.opt_state, f.values, f.residual, self.codec, share=share
      )
    if isinstance(step, str):
      return step
    f.values, f.opt_state, f.residual, encoded = step
    f.version += 1
    for u in ups:
      f.contributed[u.learner] = max(u.base_version, f.contributed.get(u.learner, -1))
      f.last_merged[u.learner] = (*u.key, f.version)
      work = f.merged.setdefault(u.learner, [0, 0])
      work[0], work[1] = work[0] + u.steps, work[1] + u.tokens
    return encoded

  def _broadcast(self, p: int, ups: list[Upload], encoded, now: float) -> list[Action]:
    """Version v of fragment p to every live learner (or its contributors; held back to the
    restart window's end with one), and the checkpoint if one is due."""
    crc = integrity.tree_crc(encoded)
    own = {u.learner: u.key for u in ups}
    to = self.live if self.policy.broadcast == "all" else self.live & set(own)
    if self.window is not None:
      actions: list[Action] = list(self.window.hold(sorted(to), p, own, now))
    else:
      actions = [self._send(m, p, encoded, crc, own.get(m)) for m in sorted(to)]
    if self.checkpoint_every and self.merges % self.checkpoint_every == 0:
      actions.append(protocol.Checkpoint(self.merges))
    return actions + self._maybe_release(now)

  def _maybe_release(self, now: float) -> list[Action]:
    """At the restart window's end, the newest version to each learner it held back."""
    if self.window is None:
      return []
    return [
        self._send(m, p, own=key, merged=True) for m, p, key in self.window.release(now, self.live)
    ]

  def _reject_round(self, p: int, now: float, ups: list[Upload], why: str) -> list[Action]:
    """Rejects every upload of a round whose merge could not be committed."""
    rejects = [admission.refusal(u.learner, p, now, why, Code.NON_FINITE_MERGE, u) for u in ups]
    self.rounds_skipped += 1
    self.rounds[p] = rounds.Round()
    return rejects

  def _unseen_own(self, learner: int, p: int, held: int, known: bool) -> tuple | None:
    """The key of `learner`'s last merged upload of p if the version it holds (`held`, of this
    lineage when `known`) predates that merge: its answer was lost (a restart, a partition) or
    the learner was restored from before it, so what the learner gets now holds that upload."""
    last = self.fragments[p].last_merged.get(learner)
    return tuple(last[:3]) if known and last is not None and last[3] > held else None

  def _send(
      self,
      learner: int,
      p: int,
      update=None,
      update_crc: int | None = None,
      own=None,
      merged: bool = False,
  ) -> Send:
    """Fragment p's newest version for `learner`: the encoded `update` (checksummed from its
    payload's CRC `update_crc`) when the learner holds the version before it, else a copy of the
    full values; what the learner holds then records the version. `own`: the key of that
    learner's upload the version merges; `merged`: it answers a merge (a release), which carries
    DyLU's steps (0: as it was) and, with `send_progress`, the inner steps merged so far."""
    num = self.frag.num_fragments
    held = self.held.setdefault(learner, [-1] * num)
    held_gen = self.held_gen.setdefault(learner, [self.generation] * num)
    f, g = self.fragments[p], self.generation
    dylu = self.dylu is not None and (update is not None or merged)
    h = self.dylu.steps_for(learner, self.live) if dylu else 0
    done = sum(w[0] for w in f.merged.values()) if self.policy.send_progress else 0
    kw = dict(generation=g, inner_steps=h, own=own, progress=done)
    if update is not None and held[p] == f.version - 1:
      crc = protocol.send_checksum(p, f.version, g, held_gen[p], update_crc, h, own, done)
      send = Send(learner, p, f.version, update, base_generation=held_gen[p], checksum=crc, **kw)
    else:
      send = Send(learner, p, f.version, values={k: x.copy() for k, x in f.values.items()}, **kw)
    held[p], held_gen[p] = f.version, g
    return send

  # ---- restarts ----

  def state_dict(self) -> dict[str, Any]:
    """Everything a restart needs: {'arrays': flat name -> np.ndarray, 'meta': JSON-able}."""
    return sync_state.state_dict(self)

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Replaces the durable state with `state` (from `state_dict`); learners must re-join."""
    sync_state.load_state_dict(self, state)
    self.live, self.held, self.held_gen = set(), {}, {}
    for p in self.owned:
      self.rounds[p] = rounds.Round()

  def restart(self, state: Mapping[str, Any], generation: int) -> None:
    """Loads a checkpoint and begins `generation` (larger than any generation before it).

    Versions up to the checkpoint's are shared with the checkpoint's generation and, as far as
    they were shared with it, with earlier ones; versions merged after it are forgotten.
    """
    self.load_state_dict(state)
    self.lineage = sync_state.lineage_after(
        self.lineage, self.generation, generation, self.versions
    )
    self.generation = generation

  def digest(self) -> str:
    """sha256 of `state_dict()`: equal digests, bit-identical durable state."""
    return sync_state.digest(self.state_dict())

  # ---- views ----

  def _history(self) -> admission.History:
    return admission.History(self.versions, self.generation, self.lineage)

  @property
  def versions(self) -> list[int]:
    """Each fragment's version (a copy); 0 for a fragment another shard owns."""
    return [
        f.version if (f := self.fragments.get(p)) else 0 for p in range(self.frag.num_fragments)
    ]

  @property
  def globals(self) -> dict[int, dict[str, np.ndarray]]:
    """Each owned fragment's global values (the state's own dicts: read, never write)."""
    return {p: f.values for p, f in self.fragments.items()}

  @property
  def pending(self) -> list[dict[int, Upload]]:
    """Each owned fragment's uploads waiting for its merge (the rounds' own dicts)."""
    return [r.pending for r in self.rounds.values()]

  def global_params(self) -> dict[str, np.ndarray]:
    """All owned global fragments as one path-keyed dict."""
    return {k: v for f in self.fragments.values() for k, v in f.values.items()}

  def merged_work(self) -> dict[int, dict[str, dict[int, int]]]:
    """Learner -> {'steps': fragment -> inner steps, 'tokens': fragment -> tokens} that reached
    a merge (`sync_state.merged_work`)."""
    return sync_state.merged_work(self.fragments)

  @property
  def merges(self) -> int:
    return int(sum(self.versions))

  def merge_clock_summary(self) -> dict[str, Any]:
    """The clock, the scale and each fragment's merges per period (merge_clock.summary)."""
    return merge_clock.summary([self.clock])
