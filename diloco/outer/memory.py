"""Malloc settings of a synchronizer process: freed large arrays are kept for reuse.

Each merge round allocates its new global values, momentum and residual whole before it commits
(commit.py), and frees the previous round's. With glibc's defaults an array of more than 32 MiB is
mmap'ed and unmapped every time, so every round touches fresh pages (about 5,300 page faults and
30 ms a round for a 64 MiB fragment, measured by scripts/bench_sync.py's helper runs). Raising the
mmap and trim thresholds keeps those arrays on the heap and reuses them; what is freed stays
resident, which is the synchronizer's steady state anyway (the same sizes every round).
"""

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
THRESHOLD = 1 << 30  # bytes; glibc caps the mmap threshold at HEAP_MAX (32 MiB on 32-bit)


def keep_freed_arrays() -> bool:
  """Sets the thresholds (glibc only); whether it could."""
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return False
  ok = libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD) == 1
  return bool(ok and libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD) == 1)
