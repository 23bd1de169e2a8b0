"""Deterministic assignment of whole documents to shards, balanced by size."""

from __future__ import annotations

from collections.abc import Sequence


def balanced_assignment(sizes: Sequence[int], num_shards: int) -> list[list[int]]:
  """Splits document indices into num_shards groups of near-equal total size.

  Greedy longest-first: documents in decreasing size (ties by index) each go to the shard with the
  smallest total so far (ties by shard index). Each group is returned in increasing index order, so
  the result depends only on the sizes. With positive sizes every shard gets at least one document.
  """
  if num_shards < 1:
    raise ValueError(f"num_shards must be >= 1, got {num_shards}")
  if len(sizes) < num_shards:
    raise ValueError(
        f"cannot give each of {num_shards} shards a whole document: only {len(sizes)} documents"
    )
  if any(s < 0 for s in sizes):
    raise ValueError(f"document sizes must be non-negative, got {list(sizes)}")
  totals = [0] * num_shards
  groups: list[list[int]] = [[] for _ in range(num_shards)]
  for doc in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
    shard = min(range(num_shards), key=lambda s: (totals[s], s))
    totals[shard] += sizes[doc]
    groups[shard].append(doc)
  return [sorted(g) for g in groups]


def check_shard(shard_index: int, num_shards: int) -> None:
  """Raises ValueError unless 0 <= shard_index < num_shards."""
  if num_shards < 1 or not 0 <= shard_index < num_shards:
    raise ValueError(f"need 0 <= shard_index < num_shards, got shard {shard_index} of {num_shards}")
