"""The learner's side of the protocol as a sans-I/O state machine: events in, decisions out.

The synchronizer's rules live in one object (synchronizer.py); these are the learner's, written
once and driven by every runtime (the virtual clock with and without faults, threads, gRPC),
which only carry the decisions out and keep time. The machine holds no arrays and takes no steps:
it reads what the learner holds (fragment versions, generations, progress counters) and keeps
what the protocol needs, per fragment, of uploads still unanswered.

The rules:
- **Uploads.** After inner step s, each fragment the schedule makes due and that progressed is
  uploaded against the version held, unless its last upload is unanswered: that delta already
  carries the progress, and a second one against the same version would count it twice (the
  real-time loop always skipped it; the virtual runtime sent it again until 2026-12-02).
- **Blocking.** A blocking learner (synchronous modes) does not start step s+τ+1 while a fragment
  it sent after step s is unanswered.
- **Merged fragments.** One is applied only if intact, from a generation not older than one
  already heard from its synchronizer (shard), and (an update) built on exactly the version held (`verdict`).
  Nor one older than the generation that answered the last real-time Join (`joined`): it was
  buffered before that synchronizer restarted, and the Join's answer supersedes it.
  A corrupt one or a gap (messages were lost) makes the learner re-join; a duplicate or an old
  generation's is dropped.
- **Refused uploads** (`outcomes.Code`): nothing comes back for them, so they stop being waited
  for. A refused base version (unknown, stale, duplicate) or a lost session makes the learner
  re-join, unless a Join sent with or after the upload already reported its versions. The
  progress of one refused for a base a restarted synchronizer lacks goes again on the version
  the Join's answer brings (`refused_base`; a learner done training schedules no next upload),
  or at once if a newer version is held already; a payload corrupted in transit is sent again, once, computed afresh on the same base; anything else is
  left to the next scheduled upload, which carries the progress.
- **Rejoin.** A restored learner, or any learner after a synchronizer restart or a healed
  partition, joins with the versions it holds; at most one Join is in flight. A restored learner
  trains again once every fragment the synchronizer sent in answer to its Join has arrived. A
  real-time learner, which cannot see whether its synchronizer restarted, sends every unanswered
  upload again after each Join, computed afresh, those that fell due while it was away included.
- **Regression.** A restarted synchronizer that lost merges the learner holds (it saves every N > 1
  merges) answers its Join with an older version: the learner keeps its parameters, takes that
  version as its base and sends the difference again (`regressed`).
- **Delivery rules** (`Learner.delivery`). Under replace every merged fragment answers the
  learner's unanswered upload of it (its progress was replaced); under rebase and at_own_sync
  only the one that merges that upload does (`Send.own` names it, in a Join's answer too when
  the learner never got that merge), and until then the learner sends no other upload of that
  fragment (the synchronizer would take it for a copy).
- **Rebase.** A copy refused as a duplicate of the version held means an earlier upload on it was
  merged and its merge never came back: that merge, when it arrives, is applied with the progress
  made after the upload kept on top (`Apply.rebase`), which is then sent again.
"""

import copy
import dataclasses
import hashlib
from typing import Protocol

from diloco.outer import protocol
from diloco.outer.outcomes import Code


class Holdings(Protocol):
  """What the machine reads of its learner (outer.learner.Learner has all of it)."""

  versions: list[int]
  generations: list[int]
  c_steps: list[int]
  steps: int

  def heard_generation(self, p: int) -> int:
    """The newest generation heard from the synchronizer (shard) that owns fragment p."""


# ---- decisions (actions out) ----


@dataclasses.dataclass(frozen=True)
class Upload:
  """Upload fragment `fragment` now, against the version held."""

  fragment: int


@dataclasses.dataclass(frozen=True)
class Apply:
  """Apply `send`. With `rebase`, the learner's own earlier upload on the version it holds was
  merged (a copy sent again was refused as a duplicate) and the progress it made after that
  upload is kept on top of the new version (`Learner.receive`), to be sent again."""

  send: protocol.Send
  rebase: bool = False


@dataclasses.dataclass(frozen=True)
class Drop:
  send: protocol.Send
  code: Code


@dataclasses.dataclass(frozen=True)
class Rejoin:
  """Join again with the versions held. `why`: resync (a merged fragment was lost or corrupt),
  refused (an upload's base was refused: the synchronizer still holds what else is pending),
  restored, sync_restart."""

  why: str


@dataclasses.dataclass(frozen=True)
class Resend:
  """Upload `fragment` again soon, computed afresh, if the version held is still `base`; with
  `as_sent`, the unanswered upload itself where the runtime still has it (`joined_unseen`)."""

  fragment: int
  base: tuple[int, int]  # (generation, version) the refused upload was built on
  as_sent: bool = False


@dataclasses.dataclass(frozen=True)
class Rejoined:
  """A restored learner holds every fragment its Join was answered with: it trains again."""


Decision = Upload | Apply | Drop | Rejoin | Resend | Rejoined


def regressed(send: protocol.Send, held: Holdings) -> bool:
  """Whether `send` is a restarted synchronizer's fragment older than the one held: merges the
  learner holds were lost with the restart (saved every N > 1 merges). The learner then keeps
  its parameters and takes the send only as its new base, so its next upload carries what the
  restored state lacks, the lost merges and its own progress (`Learner.receive`)."""
  p = send.fragment
  return (
      send.update is None
      and send.generation > held.generations[p]
      and 0 <= send.version < held.versions[p]
  )


def verdict(send: protocol.Send, held: Holdings, num_fragments: int) -> Code | None:
  """Why `send` cannot be applied by a learner holding `held` (CHECKSUM, OLD_GENERATION,
  DUPLICATE or GAP), or None."""
  p = send.fragment
  if not 0 <= p < num_fragments:
    raise ValueError(f"got fragment {p} of {num_fragments}")
  if not send.checksum_ok():
    return Code.CHECKSUM
  if send.generation < held.heard_generation(p):
    return Code.OLD_GENERATION
  have = (held.generations[p], held.versions[p])
  if send.update is not None:
    if (send.base_generation, send.version - 1) == have:
      return None
    return Code.DUPLICATE if (send.generation, send.version) <= have else Code.GAP
  return None if (send.generation, send.version) > have else Code.DUPLICATE


# ---- the machine ----

RESYNC = frozenset({Code.UNKNOWN_BASE_VERSION, Code.STALE, Code.DUPLICATE, Code.NOT_JOINED})
RESEND = frozenset({Code.CHECKSUM})
# A base a restarted synchronizer lacks: the Join's answer brings a newer version to send it on.
# (A stale base is not among them: a learner still training carries that progress with its next
# upload, and a virtual run's decisions stay as they were.)
REBASE = frozenset({Code.UNKNOWN_BASE_VERSION})
REJOIN_ON_SEND = frozenset({Code.CHECKSUM, Code.GAP})  # a merged fragment lost or corrupted


class LearnerMachine:
  """One learner's protocol state: its unanswered uploads, its Join, its rejoin."""

  def __init__(self, held: Holdings, num_fragments: int, *, blocking: bool, overlap: int):
    self.held, self.num_fragments = held, num_fragments
    self.blocking, self.overlap = blocking, overlap
    self.inflight: dict[int, int] = {}  # fragment -> the step after which it was uploaded
    self.join_inflight = False
    self.last_join = -1.0  # when the last Join was sent
    self.restoring = False  # restored, its Join not answered yet
    self.awaiting: set[int] | None = None  # restored: fragments its Join's answer still owes
    self.resent: set[tuple[int, float]] = set()  # (fragment, sent_time) of uploads sent again
    # Fragments whose upload on the version held was merged, the merge not received yet (a
    # copy sent again after a Join was refused as a duplicate): its arrival rebases.
    self.merged_unseen: set[int] = set()
    # ... and the generation that refused it: a send of that generation merges it only if it names
    # one of the learner's uploads (`arrived`).
    self.unseen_gen: dict[int, int] = {}
    # Fragments whose upload was refused for its base (unknown to a restarted synchronizer): the
    # Join's answer sends a newer version, and on it the progress goes again.
    self.refused_base: set[int] = set()
    # Rebasing, back from a synchronizer restart: its unanswered uploads wait for the Join's
    # answer (`after_join`), which may name one as merged; `answering` is what the answer owes.
    self.after_join: set[int] = set()
    self.answering: set[int] | None = None
    # Rebasing: fragments whose unanswered upload went again as it was (`joined_unseen`); what
    # was trained after it goes once a merge names it (`arrived`), or afresh if it is refused.
    self.as_sent: dict[int, float] = {}  # fragment -> when the copy went
    # Per fragment, the key of the last upload a version it took merged (`_named_once`).
    self.taken: dict[int, tuple[int, int, int]] = {}
    self.joined_gen = -1  # the synchronizer generation that answered the last real-time Join
    self.skipped = 0  # due uploads not sent: the last one of that fragment was unanswered
    # What it decided, in order: ("upload", p, base version, step), ("apply", p, version, step)
    # and ("rejoin", why, step): two runtimes given the same events decide the same (`digest`).
    self.decisions: list[tuple] = []

  _STATE = ("inflight", "join_inflight", "last_join", "restoring", "awaiting", "resent")
  _STATE += ("skipped", "decisions", "merged_unseen", "after_join", "answering", "as_sent")
  _STATE += ("joined_gen", "refused_base", "taken", "unseen_gen")
  # (absent from older snapshots)
  _NEWER = {"after_join": set(), "answering": None, "as_sent": {}, "joined_gen": -1}
  _NEWER.update(refused_base=set(), taken={}, unseen_gen={})

  def state(self) -> dict:
    """Its protocol state (not the learner it reads), for a snapshot of a virtual run."""
    return copy.deepcopy({k: getattr(self, k) for k in self._STATE})

  def load_state(self, state: dict) -> None:
    for k in self._STATE:
      setattr(self, k, copy.deepcopy(state[k] if k in state else self._NEWER[k]))

  # ---- steps ----

  def blocked(self) -> bool:
    """A blocking learner waits: a fragment sent more than τ steps ago is unanswered."""
    steps = self.held.steps
    return self.blocking and any(steps >= s + self.overlap for s in self.inflight.values())

  def holds_all(self) -> bool:
    return all(v >= 0 for v in self.held.versions)

  def stepped(self, due: list[int]) -> list[Upload]:
    """Inner step done; `due` are the fragments its schedule makes due (`Learner.due`)."""
    out = []
    for p in due:
      if p in self.inflight:
        self.skipped += 1
        continue
      self.inflight[p] = self.held.steps
      self.decisions.append(("upload", p, self.held.versions[p], self.held.steps))
      out.append(Upload(p))
    return out

  def unsent(self, p: int) -> None:
    """An upload decided on never left (the link was down): nothing will answer it."""
    self.inflight.pop(p, None)

  # ---- answers ----

  def arrived(self, send: protocol.Send) -> list[Decision]:
    """A merged fragment arrived."""
    code = verdict(send, self.held, self.num_fragments)
    if code is None and send.generation < self.joined_gen:  # stale (`joined`)
      code = Code.OLD_GENERATION
    if code is not None:
      rejoin = self._resync() if code in REJOIN_ON_SEND else None
      return [Drop(send, code)] + ([rejoin] if rejoin is not None else []) + self._answered(send)
    p, send = send.fragment, self._named_once(send)
    if self._delivery() == "replace" or send.includes_own or self.held.versions[p] < 0:
      self.inflight.pop(p, None)  # (under the other rules, its upload is still pending there)
    if self.held.versions[p] >= 0:  # (a first copy is where it starts: the virtual builder's)
      self.decisions.append(("apply", p, send.version, self.held.steps))
    out: list[Decision] = [Apply(send)]
    rebased = p in self.refused_base
    self.refused_base.discard(p)
    if regressed(send, self.held):  # what the restored state lacks goes again
      self.merged_unseen.discard(p)
      out.append(Resend(p, (send.generation, send.version)))
    elif p in self.merged_unseen and (
        send.includes_own or send.generation != self.unseen_gen.get(p)
    ):  # what it trained after its merged upload goes again (see `refused`)
      self.merged_unseen.discard(p)
      self.as_sent.pop(p, None)
      self.decisions.append(("rebase", p, send.version, self.held.steps))
      out = [Apply(send, rebase=True), Resend(p, (send.generation, send.version))]
    elif send.includes_own and self.as_sent.pop(p, None) is not None:
      out.append(Resend(p, None))  # what it trained after the upload it sent again as it was
    elif rebased and p not in self.inflight:  # a refused upload's progress, on the new base
      out.append(Resend(p, (send.generation, send.version)))
    if self.awaiting is not None:
      self.awaiting.discard(send.fragment)
      if not self.awaiting:
        self.awaiting = None
        out.append(Rejoined())
    return out + self._answered(send)

  def _named_once(self, send: protocol.Send) -> protocol.Send:
    """`send`, less its `own` if the learner already took that upload as merged. A Join's
    answer names the learner's last merged upload when the versions the Join reported predate
    its merge; on a slow link the answer of one Join can reach the learner after the next Join
    left, and both answers name the same upload. Taken twice, the second found it no longer
    pending and replaced θ_p, dropping the progress made since (a capped learner lost 90
    steps of one fragment: BENCHMARKS.md, "Faults the kernel makes")."""
    p = send.fragment
    if not send.includes_own:
      return send
    if self.taken.get(p) == send.own:
      return dataclasses.replace(send, own=None, checksum=None)
    self.taken[p] = send.own
    return send

  def _answered(self, send: protocol.Send) -> list[Decision]:
    """The uploads held back for the Join's answer go once all of it has arrived: those it did
    not name as merged, computed afresh."""
    if self.answering is None:
      return []
    self.answering.discard(send.fragment)
    return [] if self.answering else self._after_join()

  def _after_join(self) -> list[Decision]:
    """Every one held back, even one the answer named as merged: the progress trained after
    that upload (kept under rebase) goes now, not with a next scheduled upload that may never
    come (a learner that finished while the synchronizer was away). `resend_due` sends only
    what has progress."""
    held_back, self.after_join, self.answering = self.after_join, set(), None
    return [Resend(p, None) for p in sorted(held_back)]

  def refused(self, refusal: protocol.Refused) -> list[Decision]:
    """The synchronizer refused an upload of this learner (its Refused action, or the code a
    real-time host answered with)."""
    p = refusal.fragment
    self.inflight.pop(p, None)
    out: list[Decision] = []
    sent = refusal.sent_time
    copy = sent is not None and self.as_sent.get(p) == sent  # of an unanswered upload
    if copy and refusal.code is not Code.DUPLICATE:  # not merged: all of it goes, afresh
      del self.as_sent[p]
      return [Resend(p, None)]
    base = (refusal.base_generation, refusal.base_version)
    held = (self.held.generations[p], self.held.versions[p])
    if refusal.code is Code.DUPLICATE and base == held and self._delivery() != "at_own_sync":
      # An earlier upload on this version was merged. The synchronizer that refused names it in
      # every send of a version that holds it (the merge's, a Join's answer), so one of its
      # sends that names none holds it not: a Join's answer queued before that merge, on which
      # the rebase took the upload as merged, and the merge's own send, naming an upload no
      # longer pending, then dropped the progress since (the slow-link test, 88 steps). A
      # restarted synchronizer's send may hold it without naming it.
      self.merged_unseen.add(p)
      self.unseen_gen[p] = self.held.heard_generation(p)
    if refusal.code in RESYNC and sent is not None and sent > self.last_join:
      out.append(self._resync("refused"))
    if refusal.code in REBASE and self._delivery() != "at_own_sync":  # (it takes no version)
      if base == held:  # the Join's answer brings a newer version: the progress goes on it
        self.refused_base.add(p)
      else:  # it arrived before the refusal
        out.append(Resend(p, held))
    if refusal.code in RESEND and sent is not None and (p, sent) not in self.resent:
      out.append(Resend(p, (refusal.base_generation, refusal.base_version)))
    return [d for d in out if d is not None]

  def resend_due(
      self, p: int, base: tuple[int, int] | None, now: float, as_sent: bool = False
  ) -> list[Upload]:
    """Time to send fragment p again (after a refusal, a dropped send, a synchronizer restart):
    only if the version held is still `base` (None: any) and there is progress to send;
    otherwise its round is over and the next scheduled upload carries the progress. An upload
    sent again (at `now`) is not sent a third time if it is refused too."""
    held = self.held
    same = base is None or base == (held.generations[p], held.versions[p])
    if same and held.c_steps[p] > 0 and held.versions[p] >= 0:
      self.inflight.setdefault(p, held.steps)
      self.resent.add((p, now))
      if as_sent:
        self.as_sent[p] = now
      return [Upload(p)]
    self.inflight.pop(p, None)
    return []

  def give_up(self) -> list[int]:
    """Stops waiting for every unanswered upload (a stall broken); the fragments it gave up."""
    out = sorted(self.inflight)
    self.inflight.clear()
    return out

  # ---- joining ----

  def join_sent(self, now: float) -> None:
    self.join_inflight, self.last_join = True, now

  def joined(self, generation: int | None) -> None:
    """A real-time Join was answered by the synchronizer's `generation` (None: the link cannot
    tell). A send of an older generation that arrives after it was buffered before that
    synchronizer restarted (a link's poller fetched it, the learner found the synchronizer gone
    before taking it): the Join's answer, computed from the versions the Join reported, holds
    what it held. Taken after the Join, it made the answer's copy of the same version look
    new: a merge naming an upload already taken as merged, on which the learner replaced its
    fragment and dropped the progress it had made since (issue 49's gRPC test, fragment 3)."""
    if generation is not None:
      self.joined_gen = max(self.joined_gen, generation)

  def join_lost(self) -> None:
    self.join_inflight = False

  def join_answered(self, sends_to_me: set[int]) -> list[Decision]:
    """The synchronizer took the Join; `sends_to_me` are the fragments it answered with."""
    self.join_inflight = False
    out: list[Decision] = []
    if self.after_join:
      self.answering = set(sends_to_me)
      if not self.answering:
        out = self._after_join()
    if self.restoring:
      self.restoring, self.awaiting = False, set(sends_to_me)
      if not self.awaiting:
        self.awaiting = None
        return [Rejoined()]
    return out

  def joined_unseen(self, answered: set[int] = frozenset()) -> list[Decision]:
    """A real-time Join went through. Such a learner cannot see whether the synchronizer still
    holds its unanswered uploads (one that restarted forgot them; the virtual clock knows,
    `sync_restarted`), nor those it decided on while the synchronizer was away, so it sends
    each again, computed afresh: a copy replaces one still pending there, and one already
    merged is refused as a duplicate (the learner then resyncs). Nothing it trained while
    away waits for a next scheduled upload that another learner's merge may overwrite first,
    or that never comes. `answered`: those the Join's answer named as merged (read first,
    under rebase), whose later progress goes too.

    Under rebase an unanswered upload goes again as it was sent (`as_sent`): others' merges
    may have moved the version held since, and a copy computed afresh on that newer base is no
    duplicate of the upload, which the synchronizer may still hold or have merged since the
    answer was read (the Join may be a resync, not a restart): both would be merged.

    A fragment already sent again since the Join (the answer, read first under rebase, was an
    older version from a restarted synchronizer: `regressed`) holds all of its progress in that
    upload: a second copy of it was refused as a duplicate and cost a Join more (a restarted
    learner pair of tests/test_learner_process.py sent every fragment twice)."""
    self.join_inflight = False
    rebase = self._delivery() == "rebase"
    gone = {p for p, t in self.resent if t >= self.last_join}  # sent again since, afresh
    out = [Resend(p, None, as_sent=rebase) for p in sorted(set(self.inflight) - gone)]
    return out + [Resend(p, None) for p in sorted(set(answered) - set(self.inflight) - gone)]

  def holding(self) -> None:
    """A learner restored with nothing left to train: the progress its checkpoint holds may
    never have reached the synchronizer (it stopped because it could not deliver it), so every
    fragment with progress counts as unanswered, and its next Join sends them."""
    held = self.held
    for p in range(self.num_fragments):
      if held.c_steps[p] > 0 and held.versions[p] >= 0:
        self.inflight.setdefault(p, held.steps)

  def undelivered(self) -> dict[int, int]:
    """Fragment -> inner steps of progress in its unanswered upload (what a learner that stops
    now may not have delivered)."""
    return {p: self.held.c_steps[p] for p in sorted(self.inflight)}

  def _delivery(self) -> str:
    """The learner's delivery rule (`Learner.delivery`): whether a merge that does not hold its
    pending upload answers it (replace) or not (rebase, at_own_sync)."""
    return getattr(self.held, "delivery", "replace")

  def _resync(self, why: str = "resync") -> Rejoin | None:
    return None if self.join_inflight else self._rejoin(why)

  def _rejoin(self, why: str) -> Rejoin:
    self.decisions.append(("rejoin", why, self.held.steps))
    return Rejoin(why)

  def digest(self) -> str:
    """sha256 of `decisions`."""
    return hashlib.sha256(repr(self.decisions).encode()).hexdigest()

  def restored(self) -> list[Decision]:
    """Back from a crash (its state restored or started over): nothing it sent is pending."""
    self.inflight.clear()
    self.merged_unseen.clear()
    self.refused_base.clear()
    self.taken.clear()  # (restored from before a merge it took: that merge is news again)
    self.after_join, self.answering, self.as_sent = set(), None, {}
    self.join_inflight, self.restoring, self.awaiting = False, True, None
    return [self._rejoin("restored")]

  def crashed(self) -> None:
    self.inflight.clear()
    self.merged_unseen.clear()
    self.refused_base.clear()
    self.taken.clear()
    self.after_join, self.answering, self.as_sent = set(), None, {}
    self.join_inflight, self.restoring, self.awaiting = False, False, None

  def sync_restarted(self) -> list[Decision]:
    """The synchronizer came back as a new generation: join it, and send again every upload
    still unanswered, computed afresh (`_resend_after`)."""
    self.join_inflight = False
    return [self._rejoin("sync_restart")] + self._resend_after(sorted(self.inflight))

  def shard_restarted(self, fragments: list[int]) -> list[Decision]:
    """One synchronizer shard came back as a new generation: join (every shard; the others
    answer what changed), and send again the unanswered uploads of the fragments it owns."""
    self.join_inflight = False
    unanswered = [p for p in sorted(self.inflight) if p in fragments]
    return [self._rejoin("shard_restart")] + self._resend_after(unanswered)

  def _resend_after(self, fragments: list[int]) -> list[Decision]:
    """At once, or under rebase after the Join's answer: it may name one of them as merged
    (`Send.own`, a merge whose send the restart lost), and a copy computed afresh on a newer
    base is no duplicate of that upload: it would be merged again."""
    if self._delivery() != "rebase":
      return [Resend(p, None) for p in fragments]
    self.after_join, self.answering = self.after_join | set(fragments), None
    return []

  def sync_lost(self) -> None:
    """The synchronizer went down: a Join on its way to it is lost."""
    self.join_inflight = False
    self.answering = None  # (an answer on its way still lands; the next restart resends)
