"""Wall-clock timing helpers shared by the benchmark scripts."""

import time
from collections.abc import Callable

import numpy as np


def best_seconds(fns: list[Callable[[], object]], repeats: int) -> list[float]:
  """Fastest of `repeats` runs of each function, run in turn, after one warm-up each.

  Interleaving the contenders exposes them to the same background load.
  """
  best = [float("inf")] * len(fns)
  for fn in fns:
    fn()
  for _ in range(repeats):
    for i, fn in enumerate(fns):
      start = time.perf_counter()
      fn()
      best[i] = min(best[i], time.perf_counter() - start)
  return best


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
  """Median seconds per call of `fn` (which must block until its work is done)."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times))
