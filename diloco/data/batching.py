"""Training and evaluation batches of packed records, each process reading only its own rows.

The training stream is what `MapDataset.source(packed).shuffle().repeat()[p::n].batch(b)`
describes: epoch e is a permutation of all records (its own per epoch), epochs follow one another,
global batch k holds stream positions [k*B, (k+1)*B), and process p of n takes positions
k*B + p + n*j, j < b = B/n. It is computed here with numpy, a whole batch at a time, because grain's
per-element path costs about 10 us per record (scripts/bench_data.py measures both); grain still
drives it (`TrainBatchSource` is a random-access source of batches, so the iterator state is one
integer and checkpoints with orbax).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import sys
from typing import Any

import numpy as np

from diloco.data.sources import PackedTokenSource

Batch = dict[str, np.ndarray]


def process_batch_size(global_batch_size: int, process_index: int, process_count: int) -> int:
  """Rows of the global batch that this process reads; ValueError on an uneven split."""
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(
        f"need 0 <= process_index < process_count, got {process_index} of {process_count}"
    )
  if global_batch_size < 1 or global_batch_size % process_count:
    raise ValueError(
        f"global_batch_size={global_batch_size} must be a positive multiple of "
        f"process_count={process_count}"
    )
  return global_batch_size // process_count


class TrainBatchSource:
  """Batch k (for k = 0, 1, ...) of an endless, epoch-wise reshuffled stream: this process's rows.

  The permutation of epoch e comes from numpy's default generator seeded with (seed, stream, e), so
  the batches depend only on (seed, stream, records, batch sizes); `stream` separates learners that
  share data (i.i.d. shards).
  """

  def __init__(
      self,
      packed: PackedTokenSource,
      *,
      seed: int,
      global_batch_size: int,
      process_index: int = 0,
      process_count: int = 1,
      stream: int = 0,
  ):
    self.batch_size = process_batch_size(global_batch_size, process_index, process_count)
    if seed < 0 or stream < 0:
      raise ValueError(f"seed and stream must be non-negative, got seed={seed}, stream={stream}")
    self.packed = packed
    self._seed, self._stream = int(seed), int(stream)
    self._global_batch_size = global_batch_size
    self._rows_b = process_index + process_count * np.arange(self.batch_size, dtype=np.int64)
    self._perms: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

  def __len__(self) -> int:
    return sys.maxsize

  def __repr__(self) -> str:
    return (
        f"TrainBatchSource({self.packed!r}, seed={self._seed}, stream={self._stream}, "
        f"global_batch_size={self._global_batch_size}, rows={self._rows_b[:2].tolist()}...)"
    )

  def permutation(self, epoch: int) -> np.ndarray:
    """The record order of one epoch (the last few are cached)."""
    perm = self._perms.get(epoch)
    if perm is None:
      rng = np.random.default_rng([self._seed, self._stream, epoch])
      perm = rng.permutation(len(self.packed))
      self._perms[epoch] = perm
      while len(self._perms) > 4:
        self._perms.popitem(last=False)
    return perm

  def records(self, index: int) -> np.ndarray:
    """Record ids of this process's rows of global batch `index`."""
    positions_b = int(index) * self._global_batch_size + self._rows_b
    epochs_b, within_b = np.divmod(positions_b, len(self.packed))
    records_b = np.empty_like(positions_b)
    for epoch in np.unique(epochs_b):
      mask = epochs_b == epoch
      records_b[mask] = self.permutation(int(epoch))[within_b[mask]]
    return records_b

  def __getitem__(self, index: int) -> Batch:
    return self.packed.batch(self.records(index))


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """The fixed validation records a run scores, whatever its batch, mode or number of learners:
  `sample_N` at every evaluation, `final_N` at the last one. Batches are chunks of `batch_size`
  records (rounded up to a multiple of the devices that score them); the last chunk is padded with
  its first record at weight 0 (`weights_B`), so the chunking never changes what is scored."""

  source: Any  # PackedTokenSource, or images: .batch(records) and len()
  sample_N: np.ndarray
  final_N: np.ndarray
  batch_size: int
  process_index: int = 0
  process_count: int = 1

  def records(self, final: bool = False) -> np.ndarray:
    return self.final_N if final else self.sample_N

  def batches(self, final: bool = False, multiple: int = 1) -> list[Batch]:
    """This process's rows (p, p + n, ...) of each chunk, with their weights (1, or 0: padding)."""
    step = math.lcm(max(multiple, 1), self.process_count)
    chunk = -(-self.batch_size // step) * step
    records_KxC, weights_KxC = eval_chunks(self.records(final), chunk)
    rows = slice(self.process_index, None, self.process_count)
    return [
        {**self.source.batch(records_C[rows]), "weights_B": weights_C[rows]}
        for records_C, weights_C in zip(records_KxC, weights_KxC)
    ]

  def sha256(self, final: bool = False) -> str:
    return eval_set_sha256(self.source, self.records(final))


def eval_sample(num_records: int, num_sequences: int) -> np.ndarray:
  """Record ids [N] of a fixed evaluation sample spread evenly over the whole split, in order: the
  middle record of each of N equal strata. 0, or N at least the split's size, takes every record."""
  if num_sequences < 0:
    raise ValueError(f"an evaluation sample needs >= 0 sequences (0 = all), got {num_sequences}")
  if num_records < 1:
    raise ValueError("the validation set holds no complete sequence; lower seq_len")
  if num_sequences == 0 or num_sequences >= num_records:
    return np.arange(num_records, dtype=np.int64)
  strata_N = 2 * np.arange(num_sequences, dtype=np.int64) + 1
  return strata_N * num_records // (2 * num_sequences)


def eval_chunks(records_N: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
  """records_N in rows of `chunk` [K, chunk], the last padded with its first record, and the
  weights [K, chunk] (float32: 1 for a record, 0 for padding)."""
  if chunk < 1:
    raise ValueError(f"evaluation batches need >= 1 sequence, got {chunk}")
  k = -(-len(records_N) // chunk)
  records_KxC = np.empty((k, chunk), np.int64)
  weights_KxC = np.zeros((k, chunk), np.float32)
  records_KxC.reshape(-1)[: len(records_N)] = records_N
  weights_KxC.reshape(-1)[: len(records_N)] = 1.0
  tail = len(records_N) - (k - 1) * chunk
  records_KxC[-1, tail:] = records_KxC[-1, 0]
  return records_KxC, weights_KxC


def eval_set_sha256(packed: Any, records_N: np.ndarray) -> str:
  """sha256 of an evaluation set: for each array of a record, by name, its name, dtype and row
  shape, then its rows of every record in order. Equal exactly when two runs score the same
  sequences, however they are batched."""
  digest = hashlib.sha256()
  for name, x in sorted(packed.batch(records_N[:1]).items()):
    digest.update(f"{name}:{x.dtype.str}:{x.shape[1:]};".encode())
    for start in range(0, len(records_N), 4096):
      rows = packed.batch(records_N[start : start + 4096])[name]
      digest.update(np.ascontiguousarray(rows).tobytes())
  return digest.hexdigest()
