"""A thread pool for the synchronizer's merge round: numpy and zlib-ng release the GIL in their
loops, so independent pieces of a fragment (leaves, or spans of chunks of one leaf) use several
cores.

The thread count is chosen once: `THREADS` from the machine at import, or `set_threads(n)`. Work is
only ever split where the pieces' arithmetic does not depend on the split (elementwise operations,
a leaf's whole reduction in one task), so the results are the same bits for any count; one thread
runs the tasks in order in the calling thread.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

THREADS = max(1, min(os.cpu_count() or 1, 16))
# Values per task when a long tensor is split into spans: 4 Mi float32 (16 MiB), enough work to
# amortise a task's dispatch, small enough to balance a handful of leaves over the threads.
SPAN = 1 << 22

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_NAME = "merge-pool"


def set_threads(n: int) -> None:
  """Uses n threads from now on (1: no pool, every task in the calling thread)."""
  global THREADS, _pool
  if not isinstance(n, int) or n < 1:
    raise ValueError(f"threads must be a positive integer, got {n!r}")
  if _pool is not None and n != THREADS:
    _pool.shutdown()
    _pool = None
  THREADS = n


def run(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
  """[fn(x) for x in items], the calls spread over `THREADS` threads; results in order.

  Each call runs in a copy of the caller's context, so `np.errstate` applies in the workers too.
  Every call finishes before an exception (the first in item order) is raised. Called from one
  of the pool's own threads, it runs the calls there, in order (no task waits on the pool).
  """
  items = list(items)
  if THREADS == 1 or len(items) < 2 or threading.current_thread().name.startswith(_NAME):
    return [fn(x) for x in items]  # (in a worker: the pool's threads are busy with its callers)
  global _pool
  if _pool is None:
    _pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix=_NAME)
  futures = [_pool.submit(contextvars.copy_context().run, fn, x) for x in items]
  concurrent.futures.wait(futures)
  return [f.result() for f in futures]


def spans(size: int, step: int) -> list[tuple[int, int]]:
  """[start, stop) ranges covering 0..size, each a multiple of `step` long (the last shorter)
  and about `SPAN` values; one range for a small tensor."""
  per = max(SPAN // step, 1) * step
  return [(c0, min(c0 + per, size)) for c0 in range(0, size, per)] or [(0, 0)]


@atexit.register
def _shutdown() -> None:
  if _pool is not None:
    _pool.shutdown()
