"""S synchronizer shards in one process, driven as one synchronizer (the virtual runtime).

Each shard is a whole `Synchronizer` over the fragments it owns (`ownership.py`): its own
state, rounds, EMAs, generation and checkpoints. An upload goes to its fragment's owner; a Join,
a Leave and a timer's Tick go to every shard, whose actions come back in shard order. Nothing
passes between shards, so with the same events the merges of a fragment are those of one
synchronizer, except where a shard's decision reads what it saw of other fragments: the adaptive
grace window (its EMAs see only its own uploads), the outlier screen's cross-fragment norm
history, DyLU's step-time estimates, the merge clock's pace (its period and a merge's token share,
merge_clock.py) and `checkpoint_every` (counted in the shard's own merges).
"""

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from diloco.outer import protocol
from diloco.outer.sync import merge_clock
from diloco.outer.protocol import Action, Event
from diloco.outer.sync.synchronizer import Synchronizer

SEP = "/"  # a shard's arrays in the joint state_dict: "shard{s}/{name}"


class ShardedSynchronizer:
  """Shards owning `owner_of[p]` of each fragment p, behind the `Synchronizer` interface."""

  def __init__(self, shards: Sequence[Synchronizer], owner_of: Sequence[int]):
    self.shards, self.owner_of = list(shards), tuple(owner_of)
    for s, shard in enumerate(self.shards):
      mine = tuple(p for p, o in enumerate(self.owner_of) if o == s)
      if shard.owned != mine:
        raise ValueError(f"shard {s} owns fragments {shard.owned}, the ownership says {mine}")
    self.frag, self.policy = self.shards[0].frag, self.shards[0].policy
    self.down: set[int] = set()  # crashed shards (a chaos schedule's): they get no event

  def handle(self, event: Event) -> list[Action]:
    """An upload to its fragment's owner (lost if that shard is down), anything else to every
    shard that is up."""
    if isinstance(event, protocol.Upload):
      known = 0 <= event.fragment < len(self.owner_of)
      s = self.owner_of[event.fragment] if known else min(set(range(len(self.shards))) - self.down)
      return [] if s in self.down else self.shards[s].handle(event)  # (unknown: refused there)
    return [
        a for s, shard in enumerate(self.shards) if s not in self.down for a in shard.handle(event)
    ]

  def fragments_of(self, s: int) -> list[int]:
    return [p for p, o in enumerate(self.owner_of) if o == s]

  def crash(self, s: int, successor: Synchronizer) -> None:
    """Shard s loses its memory; `successor` (restarted from its checkpoint) takes its place
    but no event until `revive`: meanwhile its state is what the checkpoint held (what a save of
    the shards writes, and what an evaluation reads)."""
    if successor.owned != self.shards[s].owned:
      raise ValueError(f"shard {s} owns {self.shards[s].owned}, its successor {successor.owned}")
    self.shards[s] = successor
    self.down.add(s)

  def revive(self, s: int) -> None:
    self.down.discard(s)

  # ---- views (what runtimes and summaries read of a synchronizer) ----

  @property
  def versions(self) -> list[int]:
    return [self.shards[s].versions[p] for p, s in enumerate(self.owner_of)]

  @property
  def globals(self) -> dict[int, dict[str, np.ndarray]]:
    return {p: g for shard in self.shards for p, g in shard.globals.items()}

  @property
  def pending(self) -> list[dict]:
    return [r for shard in self.shards for r in shard.pending]

  @property
  def merges(self) -> int:
    return sum(shard.merges for shard in self.shards)

  @property
  def rounds_skipped(self) -> int:
    return sum(shard.rounds_skipped for shard in self.shards)

  @property
  def generation(self) -> int:
    return max(shard.generation for shard in self.shards)

  @property
  def live(self) -> set[int]:
    return set.intersection(*(shard.live for shard in self.shards))

  def merged_work(self) -> dict[int, dict[str, dict[int, int]]]:
    """`Synchronizer.merged_work` over every shard's fragments."""
    out: dict[int, dict[str, dict[int, int]]] = {}
    for shard in self.shards:
      for m, work in shard.merged_work().items():
        mine = out.setdefault(m, {"steps": {}, "tokens": {}})
        mine["steps"].update(work["steps"])
        mine["tokens"].update(work["tokens"])
    return dict(sorted(out.items()))

  def merge_clock_summary(self) -> dict[str, Any]:
    """The shards' clock, scale and each fragment's merges per period."""
    return merge_clock.summary([s.clock for s in self.shards])

  def global_params(self) -> dict[str, np.ndarray]:
    return dict(sorted((k, v) for shard in self.shards for k, v in shard.global_params().items()))

  # ---- restarts: every shard at once (one process holding them all) ----

  def state_dict(self) -> dict[str, Any]:
    states = [shard.state_dict() for shard in self.shards]
    arrays = {
        f"shard{s}{SEP}{k}": x for s, st in enumerate(states) for k, x in st["arrays"].items()
    }
    metas = [st["meta"] for st in states]
    return {"arrays": arrays, "meta": {"generation": self.generation, "shards": metas}}

  def _split(self, state: Mapping[str, Any]) -> list[dict[str, Any]]:
    metas = state["meta"].get("shards", [])
    if len(metas) != len(self.shards):
      raise ValueError(
          f"synchronizer state of {len(metas)} shards, this run has {len(self.shards)}"
      )
    out = [{"arrays": {}, "meta": meta} for meta in metas]
    for name, x in state["arrays"].items():
      head, _, rest = name.partition(SEP)
      out[int(head.removeprefix("shard"))]["arrays"][rest] = x
    return out

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    for shard, sub in zip(self.shards, self._split(state)):
      shard.load_state_dict(sub)

  def restart(self, state: Mapping[str, Any], generation: int) -> None:
    """Every shard from its part of `state`, as `generation` or its own next one if later."""
    for shard, sub in zip(self.shards, self._split(state)):
      shard.restart(sub, max(generation, int(sub["meta"]["generation"]) + 1))

  def restart_shard(self, s: int, state: Mapping[str, Any], generation: int) -> Synchronizer:
    """Shard s alone from its part of a joint `state`, beginning `generation` (or its own next
    one if later); the others' parts are not read."""
    sub = self._split(state)[s]
    shard = self.shards[s]
    shard.restart(sub, max(generation, int(sub["meta"]["generation"]) + 1))
    return shard

  def digest(self) -> str:
    """sha256 over the shards' digests, in shard order."""
    return hashlib.sha256("".join(s.digest() for s in self.shards).encode()).hexdigest()
