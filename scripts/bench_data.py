r"""Times the training input pipeline against grain's per-element chain, in the same run.

  python scripts/bench_data.py [--batch_size=32] [--seq_len=256] [--steps=2000] [--cache_dir=DIR]

Both read the prepared Shakespeare training split (byte tokens) and yield the same kind of batch,
{'inputs_BxL', 'targets_BxL'} int32 of shape [batch_size, seq_len]:
  pipeline   diloco.data.build_datasets: a grain source of whole batches, one numpy gather each
  reference  grain.MapDataset.source(PackedTokenSource).seed().shuffle().repeat().batch().map()
The last line is `pipeline_speedup=X.X`: reference seconds per batch / pipeline seconds per batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import grain
import numpy as np
from absl import app
from absl import flags

from diloco.config import sections
from diloco.data import pipeline, shakespeare, sources

_BATCH = flags.DEFINE_integer("batch_size", 32, "Sequences per batch.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "Tokens per sequence.")
_STEPS = flags.DEFINE_integer("steps", 2000, "Batches timed per pipeline (after 20 warm-up).")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "Data cache (default: $DILOCO_DATA_DIR or ~/.cache/diloco)."
)


def seconds_per_batch(it: Iterator, steps: int) -> float:
  """Best of three timed runs of `steps` batches, after a warm-up."""
  for _ in range(20):
    next(it)
  best = float("inf")
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(steps):
      next(it)
    best = min(best, (time.perf_counter() - start) / steps)
  return best


def reference_iter(tokens: np.ndarray, batch_size: int, seq_len: int) -> Iterator:
  """The per-element grain chain the pipeline replaces."""
  split = lambda r_BxL1: {"inputs_BxL": r_BxL1[:, :-1], "targets_BxL": r_BxL1[:, 1:]}
  ds = (
      grain.MapDataset.source(sources.PackedTokenSource(tokens, seq_len))
      .seed(0)
      .shuffle()
      .repeat()[0::1]
      .batch(batch_size)
      .map(split)
  )
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  corpus = shakespeare.ensure_prepared(_CACHE_DIR.value)
  cfg = sections.data()
  cfg.cache_dir = str(corpus.root.parent)
  data = pipeline.build_datasets(
      cfg,
      seed=0,
      global_batch_size=_BATCH.value,
      seq_len=_SEQ_LEN.value,
      process_index=0,
      process_count=1,
  )
  ours = seconds_per_batch(data.train_iter, _STEPS.value)
  ref = seconds_per_batch(
      reference_iter(corpus.train_tokens, _BATCH.value, _SEQ_LEN.value), _STEPS.value
  )
  print(
      f"batch {_BATCH.value}x{_SEQ_LEN.value}: pipeline {ours * 1e6:.1f} us/batch, "
      f"grain per-element chain {ref * 1e6:.1f} us/batch"
  )
  print(f"pipeline_speedup={ref / ours:.1f}")


if __name__ == "__main__":
  app.run(main)
