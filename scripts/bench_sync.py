"""Times the synchronizer merging one fragment from M learners against a memcpy, in the same run.

  python scripts/bench_sync.py [--mbytes=64] [--learners=8] [--merge=mean] [--downlink=fp4]
                               [--uplink=fp32] [--leaves=4] [--threads=N] [--nophases]

One fragment of --mbytes MiB of float32 (--leaves leaves of equal size; the 8b preset's fragment is
1,400 MiB: `--mbytes=1400 --leaves=6`, leaves near its 4096 x 14336 matrices). Each timed round
hands the synchronizer M uploads of that fragment in the --uplink codec, whose checksums it
verifies as they arrive; the last one triggers the merge: decode the payloads (fp32: viewed in
place), merge them (mean or RDA) and check for NaN/Inf, step Nesterov SGD, encode the update with
the downlink codec, apply its decoding and keep the residual, and build the sends with their
checksum. Printed per round: merges per second and the process's peak resident memory while the
rounds ran, over the fragment's own bytes (the synchronizer's state at rest is 3 fragments:
globals, momentum, residual; a round adds its new state, the merged update and the uploads).
The phases include the outer step's reference (optax op by op, then encode and add_decoded) beside
its fast path (`commit.outer_step`), the same bits.
Reference: np.copyto of the fragment's bytes into a preallocated buffer, timed alternately with the
rounds so both see the same machine load. The merge round's work is spread over --threads threads
(`diloco.outer.parallel`; default: the machine's cores), the same bits for any count.

Merged bandwidth counts the fragment once per learner (M × fragment bytes per round); the last line
is `sync_vs_memcpy=X.XX`, that bandwidth over the memcpy's. Before it, the round is split into its
phases (each timed alone, same inputs) to show where the time goes.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from diloco import timing
from diloco.outer import integrity, memory, merging, optimizers, parallel
from diloco.outer.codecs import compression
from diloco.outer.sync import commit, merge_round

_MBYTES = flags.DEFINE_integer("mbytes", 64, "Fragment size in MiB of float32.")
_LEARNERS = flags.DEFINE_integer("learners", 8, "Learners uploading the fragment each round.")
_MERGE = flags.DEFINE_enum("merge", "mean", list(merging.RULES), "Merge rule.")
_DOWNLINK = flags.DEFINE_enum("downlink", "fp4", list(compression.CODECS), "Downlink codec.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds; the fastest is reported.")
_THREADS = flags.DEFINE_integer(
    "threads", None, "Threads of the merge round (default: parallel.THREADS, the machine's cores)."
)
_UPLINK = flags.DEFINE_enum("uplink", "fp32", list(compression.CODECS), "The uploads' codec.")
_LEAVES = flags.DEFINE_integer("leaves", 4, "Leaves of the fragment, of equal size.")
_PHASES = flags.DEFINE_bool("phases", True, "Also time the round's phases one by one.")
_KEEP = flags.DEFINE_bool(
    "keep_freed", True, "Malloc keeps freed arrays for reuse, as the synchronizer process does."
)


def _status_kib(key: str) -> int:
  """A line of /proc/self/status in KiB (VmRSS: resident now, VmHWM: its peak)."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def reset_peak_rss() -> bool:
  """Resets the process's VmHWM to its resident memory now (Linux 4.0+); whether it could."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def main(argv):
  del argv
  m, reps = _LEARNERS.value, _REPEATS.value
  if _THREADS.value is not None:
    parallel.set_threads(_THREADS.value)
  kept = _KEEP.value and memory.keep_freed_arrays()
  params = merge_round.make_fragment(_MBYTES.value, _LEAVES.value)
  shapes = {k: x.shape for k, x in params.items()}
  round_ = merge_round.MergeRound(params, m, _UPLINK.value, _MERGE.value, _DOWNLINK.value)
  del params  # (the synchronizer holds its own copy)
  sync, uploads, nbytes = round_.sync, round_.uploads, round_.fragment_bytes

  leaf = next(iter(shapes.values()))
  # The reference: a memcpy of the whole fragment where the phases are timed against it, else
  # of one leaf (a large fragment's copy would hold another fragment; its bandwidth is the same).
  whole = _PHASES.value and _UPLINK.value == "fp32"
  ref = sync.globals[0].values() if whole else [next(iter(sync.globals[0].values()))]
  src = np.concatenate([x.reshape(-1) for x in ref])
  dst = np.empty_like(src)
  np.copyto(dst, src)  # (both resident before the peak is reset)
  rest_kib = _status_kib("VmRSS")
  peak_known = reset_peak_rss()
  memcpy, t_round = timing.best_seconds([lambda: np.copyto(dst, src), round_], reps)
  peak_kib = _status_kib("VmHWM")
  memcpy *= nbytes / src.nbytes  # the fragment's copy at the measured bandwidth
  up_bytes = sum(e.nbytes for u in uploads for e in u.delta.values())
  merged_bw = m * nbytes / t_round
  copy_bw = nbytes / memcpy
  print(
      f"fragment {nbytes / 2**20:.0f} MiB ({len(shapes)} leaves of {leaf}), {m} learners, "
      f"uploads {_UPLINK.value} ({up_bytes / m / 2**20:.0f} MiB each), merge={_MERGE.value}, "
      f"outer nesterov, downlink {_DOWNLINK.value}, best of {reps}, "
      f"{parallel.THREADS} thread{'s' if parallel.THREADS > 1 else ''}, freed arrays "
      f"{'kept' if kept else 'returned'}"
  )
  print(
      f"memcpy {memcpy * 1e3:8.2f} ms  ({copy_bw / 1e9:.2f} GB/s{'' if whole else ', one leaf copied'})"
  )
  print(f"round  {t_round * 1e3:8.2f} ms  ({merged_bw / 1e9:.2f} GB/s of uploads merged)")
  print(f"merges_per_s={1 / t_round:.3f}")
  if peak_known:  # the rounds' peak; at rest: the state, the uploads, the memcpy pair
    frag_kib = nbytes / 1024
    print(
        f"peak_rss={peak_kib / 2**20:.2f} GiB ({peak_kib / frag_kib:.2f} fragments; at rest "
        f"before the rounds {rest_kib / 2**20:.2f} GiB = {rest_kib / frag_kib:.2f}; the rounds "
        f"added {(peak_kib - rest_kib) / frag_kib:.2f})"
    )
  if not _PHASES.value or _UPLINK.value != "fp32":
    print(f"sync_vs_memcpy={merged_bw / copy_bw:.2f}")
    return

  # Phases of one round, each on the same inputs, to see where the time goes.
  decoded = [
      {
          k: np.frombuffer(e.payload, np.float32).reshape(e.shape)  # viewed in place
          for k, e in u.delta.items()
      }
      for u in uploads
  ]
  weights = merging.equal_weights(m)
  merged, _ = merging.merge_checked(decoded, weights, rule=_MERGE.value)
  tx, old = optimizers.nesterov(0.7, 0.9), sync.globals[0]
  residual = {k: np.zeros_like(x) for k, x in old.items()}
  opt_state = [tx.init(old)]

  def outer_step():
    raw, opt_state[0] = optimizers.host_step(tx, merged, opt_state[0], old, residual)
    return raw

  raw = outer_step()
  enc = compression.encode_tree(raw, _DOWNLINK.value)
  residual_out = {k: x.copy() for k, x in raw.items()}  # becomes raw − decoded, in place
  phases = {
      "upload checksums": lambda: [integrity.tree_crc(u.delta) for u in uploads],
      f"merge ({_MERGE.value}) + finite": lambda: merging.merge_checked(
          decoded, weights, rule=_MERGE.value
      ),
      "outer step (compiled)": outer_step,
      "outer step (optax)": lambda: optimizers.reference_step(
          tx, merged, opt_state[0], old, residual
      ),
      "downlink encode": lambda: compression.encode_tree(raw, _DOWNLINK.value),
      "decode, apply, residual": lambda: {
          k: compression.add_decoded(old[k], enc[k], residual_out[k]) for k in old
      },
      "send checksum": lambda: integrity.tree_crc(enc),
      # What the round runs instead of the three above: one pass (int8, fp4) when it can.
      "commit.outer_step": lambda: commit.outer_step(
          tx, merged, opt_state[0], old, residual, _DOWNLINK.value
      ),
      # The contract the fast path keeps bit for bit: optax, encode, add_decoded.
      "commit, the reference": lambda: commit.outer_step(
          tx, merged, opt_state[0], old, residual, _DOWNLINK.value, fast=False
      ),
  }
  times = timing.best_seconds([lambda: np.copyto(dst, src), *phases.values()], reps)
  for name, t in zip(phases, times[1:]):
    print(
        f"  {name:22s} {t * 1e3:8.2f} ms = {t / times[0]:6.2f}x memcpy  "
        f"({t / t_round:5.1%} of a round)"
    )
  timed = dict(zip(phases, times[1:]))
  in_round = [timed[n] for n in list(phases)[:2] + ["commit.outer_step", "send checksum"]]
  print(f"  {'checksums+merge+commit+send':22s} {sum(in_round) * 1e3:8.2f} ms")
  print(f"sync_vs_memcpy={merged_bw / copy_bw:.2f}")


if __name__ == "__main__":
  app.run(main)
