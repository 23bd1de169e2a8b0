r"""Resident memory and throughput of the streamed corpus reader (diloco/data/corpus/stream.py).

  python scripts/bench_corpus.py [--workdir=/tmp/bench_corpus] [--sizes_mb=100,2000] \
      [--seq_len=4096] [--batch_size=16] [--batches=400]

For each size it writes a prepared corpus of that many megabytes of uint16 token ids (documents
of 200 to 2,000 random ids, 16 shards, a manifest: what `experiments.prepare` writes, without a
tokenizer), then in a fresh process reads it as one reader of all its shards: the resident set
(VmRSS) after the first 20 batches and after --batches, and tokens per second over the batches
between. The last lines are the ratios: the largest corpus's resident set over the smallest's,
and tokens/s over what the 1b preset's train step takes on one v5p host (4 chips x 25,602
tokens/s per chip at MFU 0.462, docs/plans_issue52/1b_v5p8_4096.json).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np
from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bench_corpus", "Where the corpora go.")
_SIZES = flags.DEFINE_list("sizes_mb", ["100", "2000"], "Corpus sizes in MB of token ids.")
_SEQ = flags.DEFINE_integer("seq_len", 4096, "Tokens per sequence (the 1b plan's).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Sequences per batch (the 1b plan's per host).")
_BATCHES = flags.DEFINE_integer("batches", 400, "Batches read after the warm-up.")
_READ = flags.DEFINE_string("read", None, "(internal) read this corpus and print JSON.")

NEED_TOKENS_PER_S = 4 * 25602.515278956398  # one v5p host of the 1b plan
SHARDS = 16
VOCAB = 32000


def write_corpus(directory: str, megabytes: int) -> None:
  from array_record.python import array_record_module

  from diloco.data.corpus import manifest as manifest_lib

  if os.path.exists(os.path.join(directory, manifest_lib.NAME)):
    return
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(megabytes)
  per_shard = megabytes * (1 << 20) // 2 // SHARDS  # tokens
  shards = []
  for i in range(SHARDS):
    name = manifest_lib.shard_name(i, SHARDS)
    path = os.path.join(directory, name)
    w = array_record_module.ArrayRecordWriter(path, manifest_lib.ARRAY_RECORD_OPTIONS)
    docs = tokens = 0
    while tokens < per_shard:
      n = int(rng.integers(200, 2001))
      w.write(rng.integers(1, VOCAB, n, dtype=np.uint16).tobytes())
      docs, tokens = docs + 1, tokens + n
    w.close()
    with open(path, "rb") as f:
      sha = hashlib.file_digest(f, "sha256").hexdigest()
    shards.append(manifest_lib.Shard(name, docs, tokens, os.path.getsize(path), sha, VOCAB - 1))
  m = manifest_lib.Manifest({"kind": "none"}, VOCAB, 0, "<u2", tuple(shards), {"generated": True})
  manifest_lib.write(directory, m)


def rss_mib() -> float:
  with open("/proc/self/status") as f:
    kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
  return kb / 1024


def read(directory: str) -> dict:
  from diloco.data.corpus import manifest as manifest_lib, stream

  m = manifest_lib.read(directory)
  (mine,) = stream.assign(len(m.shards), 1)
  paths = stream.local_shards(directory, m, mine, os.path.join(directory, "cache"))
  ds = stream.dataset(paths, list(m.shards), m, seed=0, seq_len=_SEQ.value, batch_size=_BATCH.value)
  it = iter(ds)
  for _ in range(20):
    next(it)
  warm = rss_mib()
  start = time.perf_counter()
  for _ in range(_BATCHES.value):
    next(it)
  seconds = time.perf_counter() - start
  tokens = _BATCHES.value * _BATCH.value * _SEQ.value
  return {"corpus_tokens": m.tokens, "rss_warm_mib": warm, "rss_end_mib": rss_mib(),
          "tokens_per_s": tokens / seconds}  # fmt: skip


def main(argv: Sequence[str]) -> None:
  del argv
  if _READ.value:
    print(json.dumps(read(_READ.value)))
    return
  rows = {}
  for mb in _SIZES.value:
    directory = os.path.join(_WORKDIR.value, f"{mb}mb")
    write_corpus(directory, int(mb))
    out = subprocess.run(
        [sys.executable, __file__, f"--read={directory}", f"--seq_len={_SEQ.value}"]
        + [f"--batch_size={_BATCH.value}", f"--batches={_BATCHES.value}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows[mb] = json.loads(out.stdout.strip().splitlines()[-1])
    r = rows[mb]
    print(
        f"{mb:>6} MB  {r['corpus_tokens']:>13,} tokens  RSS {r['rss_warm_mib']:7.1f} -> "
        f"{r['rss_end_mib']:7.1f} MiB  {r['tokens_per_s']:>12,.0f} tokens/s"
    )
  small, large = rows[_SIZES.value[0]], rows[_SIZES.value[-1]]
  print(f"rss_largest_over_smallest={large['rss_end_mib'] / small['rss_end_mib']:.3f}")
  slowest = min(r["tokens_per_s"] for r in rows.values())
  print(f"tokens_per_s_over_1b_v5p_host_need={slowest / NEED_TOKENS_PER_S:.2f}")


if __name__ == "__main__":
  app.run(main)
