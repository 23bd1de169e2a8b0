"""Which synchronizer shard owns which fragment (`outer.sync_shards`).

Fragments are merged independently of each other, so S synchronizer processes can each own a
set of them: fragment p belongs to exactly one shard, and a shard holds the state of its own
fragments only. Ownership is balanced by bytes (fragments by size descending, ties by index, each
to the shard holding the fewest bytes so far; ties to the shard with fewer fragments, then the
lowest index) and depends only on the fragments' sizes, so every process computes the same map.
"""

import heapq
from collections.abc import Sequence


def check(num_shards: int, num_fragments: int) -> None:
  """ValueError unless 1 <= num_shards <= num_fragments (a shard owns at least one fragment)."""
  if not isinstance(num_shards, int) or num_shards < 1:
    raise ValueError(f"outer.sync_shards must be a positive integer, got {num_shards!r}")
  if num_shards > num_fragments:
    raise ValueError(
        f"outer.sync_shards={num_shards} exceeds outer.fragments={num_fragments}: "
        "a shard would own no fragment"
    )


def owners(nbytes: Sequence[int], num_shards: int) -> tuple[int, ...]:
  """The shard of each fragment, from each fragment's bytes."""
  check(num_shards, len(nbytes))
  heap = [(0, 0, s) for s in range(num_shards)]  # (bytes, fragments, shard)
  out = [0] * len(nbytes)
  for p in sorted(range(len(nbytes)), key=lambda p: (-nbytes[p], p)):
    load, count, s = heapq.heappop(heap)
    out[p] = s
    heapq.heappush(heap, (load + nbytes[p], count + 1, s))
  return tuple(out)


def owned(owner_of: Sequence[int], shard: int) -> tuple[int, ...]:
  """The fragments shard `shard` owns, in index order."""
  mine = tuple(p for p, s in enumerate(owner_of) if s == shard)
  if not mine:
    raise ValueError(f"shard {shard} owns no fragment (owners {tuple(owner_of)})")
  return mine


def checked_owned(owned: Sequence[int] | None, num_fragments: int) -> tuple[int, ...]:
  """A synchronizer's owned fragments (None: all of them); ValueError unless sorted, distinct,
  non-empty and in range."""
  out = tuple(range(num_fragments)) if owned is None else tuple(owned)
  if not out or list(out) != sorted(set(out)) or not 0 <= out[0] <= out[-1] < num_fragments:
    raise ValueError(
        f"owned fragments {out} must be sorted, distinct and in 0..{num_fragments - 1}"
    )
  return out
