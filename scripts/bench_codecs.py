"""Times the host-side codecs and merges against a memcpy of the same fragment, in the same run.

  python scripts/bench_codecs.py [--mbytes=64] [--learners=8] [--repeats=5]

One fragment is --mbytes of float32 outer gradient (normal values). Reference: np.copyto of the
fragment into a preallocated buffer (reads and writes the fragment once), timed alternately with
each measured operation so that both see the same machine load. For each codec it prints encode and
decode time as a multiple of that memcpy. For the merges of --learners deltas it prints the
effective bandwidth (bytes of deltas read plus result written, over the time) as a fraction of the
memcpy's, and the speedup over the plain numpy expression sum(w·Δ). The last line is
`mean_merge_bandwidth_vs_memcpy=X.XX`.
"""

from __future__ import annotations


import numpy as np
from absl import app, flags

from diloco import timing
from diloco.outer import merging
from diloco.outer.codecs import compression

_MBYTES = flags.DEFINE_integer("mbytes", 64, "Fragment size in MiB of float32.")
_LEARNERS = flags.DEFINE_integer("learners", 8, "Deltas merged.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per measurement; the best is reported.")


def naive_mean(deltas: list[np.ndarray], w: np.ndarray) -> np.ndarray:
  return sum(np.float32(wm) * d for wm, d in zip(w, deltas))


def main(argv):
  del argv
  n = _MBYTES.value * 2**20 // 4
  reps = _REPEATS.value
  rng = np.random.default_rng(0)
  x_N = rng.standard_normal(n, dtype=np.float32)
  dst = np.empty_like(x_N)
  copy = lambda: np.copyto(dst, x_N)  # noqa: E731
  print(f"fragment {x_N.nbytes / 2**20:.0f} MiB of float32, {reps} timed runs each, best kept")
  memcpy, t_bytes = timing.best_seconds([copy, x_N.tobytes], reps)
  print(
      f"x.tobytes() alone (a fresh bytes object, as every payload is): "
      f"{t_bytes * 1e3:.2f} ms = {t_bytes / memcpy:.2f}x memcpy"
  )

  variants = [(c, "log") for c in compression.CODECS]
  variants += [("fp4", r) for r in compression.ROUNDINGS if r != "log"]
  for codec, rounding in variants:
    gen = np.random.default_rng(1)
    enc = compression.encode(x_N, codec, rounding=rounding, rng=gen)
    encode = lambda: compression.encode(x_N, codec, rounding=rounding, rng=gen)  # noqa: E731
    memcpy, t_enc, t_dec = timing.best_seconds(
        [copy, encode, lambda: compression.decode(enc)], reps
    )
    name = codec if rounding == "log" else f"{codec} {rounding}"
    print(
        f"{name:15s} wire {enc.nbytes / x_N.nbytes:.4f} of fp32  "
        f"memcpy {memcpy * 1e3:5.2f} ms  "
        f"encode {t_enc * 1e3:6.2f} ms = {t_enc / memcpy:5.2f}x  "
        f"decode {t_dec * 1e3:6.2f} ms = {t_dec / memcpy:5.2f}x memcpy"
    )

  m = _LEARNERS.value
  deltas = [rng.standard_normal(n, dtype=np.float32) for _ in range(m)]
  w = merging.equal_weights(m)
  memcpy, t_naive, t_mean, t_rda = timing.best_seconds(
      [
          copy,
          lambda: naive_mean(deltas, w),
          lambda: merging.weighted_mean(deltas, w),
          lambda: merging.rda(deltas, w),
      ],
      reps,
  )
  memcpy_bw = 2 * x_N.nbytes / memcpy
  moved = (m + 1) * x_N.nbytes  # every delta read once, the result written once
  print(f"memcpy {memcpy * 1e3:.2f} ms ({memcpy_bw / 1e9:.1f} GB/s read+write)")
  for name, t in (("naive sum(w*d)", t_naive), ("weighted_mean", t_mean), ("rda", t_rda)):
    print(
        f"merge {m} x {x_N.nbytes / 2**20:.0f} MiB {name:15s} {t * 1e3:8.2f} ms  "
        f"bandwidth {moved / t / memcpy_bw:.2f} of memcpy  "
        f"speedup over naive {t_naive / t:.2f}x"
    )
  print(f"mean_merge_bandwidth_vs_memcpy={moved / t_mean / memcpy_bw:.2f}")


if __name__ == "__main__":
  app.run(main)
