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
import hashlib
import logging
import sys

import numpy as np

from diloco.data.sources import PackedTokenSource

Batch = dict[str, np.ndarray]

_log = logging.getLogger(__name__)


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


def eval_records(num_records: int, *, global_batch_size: int, num_batches: int) -> np.ndarray:
  """Record ids of the fixed evaluation set, [batches, B], in record order: global batch k is
  records [k*B, (k+1)*B). This decides what evaluation scores (`eval_batches`) and hashes
  (`eval_set_sha256`).

  num_batches = 0 takes every full batch, and so does a number larger than the set holds (logged).
  """
  available = num_records // global_batch_size
  if available == 0:
    raise ValueError(
        f"the validation set has {num_records} sequences, fewer than one global batch "
        f"of {global_batch_size}"
    )
  if num_batches < 0:
    raise ValueError(f"eval_batches must be >= 0 (0 = all), got {num_batches}")
  if num_batches > available:
    _log.warning(
        "eval_batches=%d but the validation set holds %d full batches of %d; using %d.",
        num_batches,
        available,
        global_batch_size,
        available,
    )
    num_batches = available
  n = num_batches or available
  return np.arange(n * global_batch_size, dtype=np.int64).reshape(n, global_batch_size)


def eval_batches(
    packed: PackedTokenSource,
    *,
    global_batch_size: int,
    num_batches: int,
    process_index: int = 0,
    process_count: int = 1,
) -> list[Batch]:
  """This process's rows (p, p + n, ...) of each fixed evaluation batch (`eval_records`)."""
  process_batch_size(global_batch_size, process_index, process_count)
  records_KxB = eval_records(
      len(packed), global_batch_size=global_batch_size, num_batches=num_batches
  )
  return [packed.batch(records_B[process_index::process_count]) for records_B in records_KxB]


def eval_set_sha256(packed: PackedTokenSource, records_KxB: np.ndarray) -> str:
  """sha256 of the evaluation set (`records_KxB` from `eval_records`, every process's rows): for
  each array of a batch, by name, its name, dtype and row shape, then its rows of every batch in
  order. Equal exactly when two runs score the same sequences, however they are batched."""
  digest = hashlib.sha256()
  for name, x in sorted(packed.batch(records_KxB[0]).items()):
    digest.update(f"{name}:{x.dtype.str}:{x.shape[1:]};".encode())
    for records_B in records_KxB:
      digest.update(np.ascontiguousarray(packed.batch(records_B)[name]).tobytes())
  return digest.hexdigest()
