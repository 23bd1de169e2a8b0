"""What the faults of a chaos run did: counters, and the fate of every tainted message.

A tainted message is one a fault corrupted (bits flipped after its checksum) or poisoned (NaN,
Inf or huge values at the source). `Taints` follows each one from the wire to its fate: rejected by
the synchronizer (by reject code) or refused by its learner, merged (the checks failed), superseded
by a newer upload of the same learner and fragment before its round merged, or lost (dropped with a
crashed process, or still on its way or pending when the run ended).
"""

import collections
import dataclasses
from typing import Any

from diloco.outer import outcomes, protocol


@dataclasses.dataclass
class ChaosStats:
  """Counters of a chaos run; `runners.island_summary.chaos_summary` turns them into summary keys."""

  faults: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  ignored: int = 0  # faults that found nothing to act on (e.g. a crash of a learner down)
  unused: int = 0  # taints and 'save' crashes still armed at the end
  crashes: list = dataclasses.field(default_factory=list)  # {learner, time, back, rejoined...}
  restarts: list = dataclasses.field(default_factory=list)  # {time, back, merges, restored}
  merges_skipped: int = 0
  resyncs: int = 0
  stalls_broken: int = 0  # lockstep learners that gave up waiting (see runtime/virtual_chaos.py)
  dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  refused_by_learners: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  tainted: dict = dataclasses.field(default_factory=dict)  # kind -> Counter of fates
  steps_lost: list = dataclasses.field(default_factory=list)

  def fate(self, kind: str, outcome: str) -> None:
    self.tainted.setdefault(kind, collections.Counter())[outcome] += 1


class Taints:
  """Follows tainted messages (see the module doc) into `stats.tainted`."""

  def __init__(self, stats: ChaosStats):
    self.stats = stats
    self.up: dict[tuple, str] = {}  # (m, p, sent_time) -> kind, on the wire to the sync
    self.pending: dict[tuple, tuple] = {}  # (m, p) -> ((m, p, sent_time), kind) in a round
    self.down: dict[int, tuple[str, Any]] = {}  # id(send) -> (kind, send), on the wire

  def sent_up(self, up: protocol.Upload, kind: str) -> None:
    self.stats.fate(kind, "sent")
    self.up[(up.learner, up.fragment, up.sent_time)] = kind

  def sent_down(self, send: protocol.Send, kind: str) -> None:
    self.stats.fate(kind, "sent")
    self.down[id(send)] = (kind, send)

  def arrived_down(self, send: protocol.Send, refusal: str | None) -> None:
    tainted = self.down.pop(id(send), None)
    if tainted is not None:
      self.stats.fate(tainted[0], f"refused ({refusal})" if refusal else "applied")

  def handled(self, event: protocol.Event, actions: list[protocol.Action]) -> None:
    """Follows the synchronizer's answer to `event`."""
    if isinstance(event, protocol.Upload):
      self._arrived_up(event, actions)
    for a in actions:
      if isinstance(a, protocol.Log) and a.record["event"] == "merge":
        for m in a.record["learners"]:
          pending = self.pending.pop((m, a.record["fragment"]), None)
          if pending is not None:
            self.stats.fate(pending[1], "merged")
      elif isinstance(a, protocol.Refused) and a.sent_time is not None:
        key = (a.learner, a.fragment)
        pending = self.pending.get(key)
        if pending is not None and pending[0][2] == a.sent_time:
          del self.pending[key]
          self.stats.fate(pending[1], f"rejected ({a.code})")

  def _arrived_up(self, up: protocol.Upload, actions: list[protocol.Action]) -> None:
    key = (up.learner, up.fragment, up.sent_time)
    kind = self.up.pop(key, None)
    reject = next(
        (
            a
            for a in actions
            if isinstance(a, protocol.Refused)
            and a.sent_time == key[2]
            and (a.learner, a.fragment) == key[:2]
        ),
        None,
    )
    if reject is None or reject.code.at_merge:  # it entered the round
      old = self.pending.pop(key[:2], None)
      if old is not None:
        self.stats.fate(old[1], "superseded")
    if reject is not None:
      if kind is not None:
        self.stats.fate(kind, f"rejected ({reject.code})")
    elif kind is not None:
      self.pending[key[:2]] = (key, kind)  # followed by `handled` until its round ends

  def synchronizer_crashed(self) -> None:
    for _, kind in self.pending.values():
      self.stats.fate(kind, "lost")
    self.pending.clear()

  def finish(self) -> None:
    for _, kind in self.pending.values():
      self.stats.fate(kind, "pending at the end")
    for kind in self.up.values():
      self.stats.fate(kind, "lost")
    for kind, _ in self.down.values():
      self.stats.fate(kind, "lost")


class PoisonFates:
  """Poisoned uploads that entered a round, followed to their fate from the synchronizer's log
  records (what a real-time runtime sees of it): its round rejects it, merges it, or merges a
  newer upload of that learner and fragment that replaced it (superseded). An upload is told apart
  from its successor by its base version and progress."""

  def __init__(self, stats: ChaosStats):
    self.stats = stats
    self.pending: dict[tuple[int, int], tuple[str, int, int, int]] = {}  # (m, p) -> its marks

  def entered(self, up: protocol.Upload, kind: str) -> None:
    self.pending[(up.learner, up.fragment)] = (kind, up.base_version, up.steps, up.tokens)

  def follow(self, record: dict) -> None:
    if record["event"] == "reject" and outcomes.parse(record["code"]).at_merge:
      key = (record["learner"], record["fragment"])
      poisoned = self.pending.get(key)
      if poisoned is not None and poisoned[1] == record.get("base_version"):
        del self.pending[key]
        self.stats.fate(poisoned[0], f"rejected ({record['code']})")
    elif record["event"] == "merge":
      for i, m in enumerate(record["learners"]):
        poisoned = self.pending.pop((m, record["fragment"]), None)
        if poisoned is None:
          continue
        base = record["version"] - 1 - record["staleness"][i]
        same = poisoned[1:] == (base, record["steps"][i], record["tokens"][i])
        self.stats.fate(poisoned[0], "merged" if same else "superseded")

  def finish(self) -> None:
    for poisoned in self.pending.values():
      self.stats.fate(poisoned[0], "pending at the end")
    self.pending.clear()
