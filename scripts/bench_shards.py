"""Synchronizer shards measured: resident memory per shard process, and merges per second of S
shard processes against one process that owns every fragment.

  python scripts/bench_shards.py --part=memory       # model=90m, S = 1, 2, 4
  python scripts/bench_shards.py --part=throughput   # S = 2 processes against 1, --seconds each

memory: for each S, each shard s runs in a fresh process that builds its synchronizer the way
`experiments.synchronizer --shard=s` does (the initial parameters of the config's model, then the
shard over the fragments it owns), drops everything else, returns freed memory to the OS
(malloc_trim) and reports its resident set (VmRSS) and the bytes of its durable state (global
values, outer optimizer state, downlink residual: 12 bytes per parameter with Nesterov).
A process that imported JAX and built nothing is the baseline printed first.

throughput: a synthetic model of --fragments fragments of --mbytes MiB; M=--learners uploads per
round; each process merges the fragments it owns round after round for --seconds (rounds as in
scripts/bench_sync.py: checksums verified, merge, outer Nesterov step, fp4 downlink, sends). The
S processes start together; the line `shards_vs_one=X.XX` is their merges per second summed over
one process's, measured in the same run. --threads: the merge round's threads in each process
(0: diloco.outer.parallel's default, the machine's cores).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = "configs/shakespeare.py:mode=decoupled,model=90m"
OVERRIDES = ("--config.outer.fragments=8", "--config.outer.fragment_kind=balanced")


def _rss_mib() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError("no VmRSS in /proc/self/status")


def _trim() -> None:
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except OSError:
    pass


def one_shard(shards: int, shard: int) -> dict:
  """Builds shard `shard` of `shards` as the synchronizer process does; its memory."""
  jax = importlib.import_module("jax")  # (the baseline includes JAX)

  from diloco.rpc import local, sync_main

  if shards == 0:  # the baseline: JAX imported, nothing built
    _trim()
    return {"rss_mib": _rss_mib()}
  config = local.load_config(CONFIG, (*OVERRIDES, f"--config.outer.sync_shards={shards}"))
  sync = sync_main.make_synchronizer(config, shard)
  _trim()
  rss = _rss_mib()  # (state_dict() would copy the state: read the records in place)
  leaves = [
      x
      for f in sync.fragments.values()
      for x in (*f.values.values(), *f.residual.values(), *jax.tree.leaves(f.opt_state))
  ]
  return {
      "shards": shards,
      "shard": shard,
      "owned": list(sync.owned),
      "params": sum(x.size for f in sync.fragments.values() for x in f.values.values()),
      "state_mib": sum(x.nbytes for x in leaves) / 2**20,
      "rss_mib": rss,
  }


def _child(args: list[str]) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=True
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def memory() -> None:
  base = _child(["--part=one_shard", "--shards=0"])["rss_mib"]
  print(f"baseline (JAX imported, nothing built): {base:.0f} MiB resident")
  print("S  shard  fragments      params  state MiB  RSS MiB  RSS - baseline")
  for shards in (1, 2, 4):
    for s in range(shards):
      r = _child(["--part=one_shard", f"--shards={shards}", f"--shard={s}"])
      print(
          f"{shards}  {s:5d}  {str(r['owned']):14s} {r['params']:10,d}  {r['state_mib']:9.0f}"
          f"  {r['rss_mib']:7.0f}  {r['rss_mib'] - base:14.0f}"
      )


def merge_loop(a) -> dict:
  """Merges the fragments this process owns for `seconds`, from `start` (wall clock)."""
  import numpy as np

  from diloco.outer import fragments, integrity, memory, optimizers
  from diloco.outer.codecs import compression
  from diloco.outer.sync import ownership
  from diloco.outer import parallel, policies
  from diloco.outer.protocol import Join, Upload
  from diloco.outer.sync.synchronizer import Synchronizer

  memory.keep_freed_arrays()  # as the synchronizer process does
  if a.threads:
    parallel.set_threads(a.threads)
  rng = np.random.default_rng(0)
  rows = a.mbytes * 2**20 // 4 // 1024
  params = {
      f"f{p}": rng.standard_normal((rows, 1024), dtype=np.float32) for p in range(a.fragments)
  }
  frag = fragments.balanced(params, a.fragments)
  owner_of = ownership.owners([frag.nbytes(p, params) for p in range(a.fragments)], a.shards)
  owned = ownership.owned(owner_of, a.shard)
  policy = policies.Policy(
      policies.AllLive(), policies.NoGrace(), policies.EqualWeights(), policies.Mean()
  )
  sync = Synchronizer(
      params, frag, policy, optimizers.nesterov(0.7, 0.9), downlink_codec="fp4", owned=owned
  )
  for m in range(a.learners):
    sync.handle(Join(m, 0.0, (0,) * a.fragments))
  uploads = {}
  for p in owned:
    for m in range(a.learners):
      delta = {
          k: rng.standard_normal(params[k].shape, dtype=np.float32) * np.float32(1e-3)
          for k in frag.paths[p]
      }
      enc = compression.encode_tree(delta, "fp32")
      uploads[p, m] = (Upload(m, p, 0, enc, 8, 8192, 0.0, 0.0, 1.0), integrity.tree_crc(enc))
  time.sleep(max(a.start - time.time(), 0.0))
  t0, merges, i = time.perf_counter(), 0, 0
  while time.perf_counter() - t0 < a.seconds:
    p = owned[i % len(owned)]
    v = sync.versions[p]
    for m in range(a.learners):
      up, crc = uploads[p, m]
      checksum = integrity.with_header((p, up.base_generation, v, up.steps, up.tokens), crc)
      sync.handle(dataclasses.replace(up, base_version=v, checksum=checksum))
    merges += sync.versions[p] == v + 1
    i += 1
  wall = time.perf_counter() - t0
  return {"shard": a.shard, "owned": list(owned), "merges": merges, "wall_s": wall}


def throughput(a) -> None:
  runs = {}
  for shards in (1, 2):
    start = time.time() + 20.0  # every process built its state and uploads by then
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--part=merge_loop",
                f"--shards={shards}",
                f"--shard={s}",
                f"--start={start}",
                f"--seconds={a.seconds}",
                f"--fragments={a.fragments}",
                f"--mbytes={a.mbytes}",
                f"--learners={a.learners}",
                f"--threads={a.threads}",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, JAX_PLATFORMS="cpu"),
        )
        for s in range(shards)
    ]
    rows = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    rate = sum(r["merges"] / r["wall_s"] for r in rows)
    runs[shards] = rate
    per = ", ".join(f"shard {r['shard']} {r['merges'] / r['wall_s']:.2f}/s" for r in rows)
    print(
        f"S={shards}: {rate:.2f} merges/s ({per}); fragments of {a.mbytes} MiB, "
        f"{a.learners} learners, fp4 downlink, {os.cpu_count()} cores, "
        f"{a.threads or 'default'} merge threads per process"
    )
  print(f"shards_vs_one={runs[2] / runs[1]:.2f}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--part", choices=("memory", "throughput", "one_shard", "merge_loop"))
  ap.add_argument("--shards", type=int, default=1)
  ap.add_argument("--shard", type=int, default=0)
  ap.add_argument("--seconds", type=float, default=20.0)
  ap.add_argument("--start", type=float, default=0.0)
  ap.add_argument("--fragments", type=int, default=8)
  ap.add_argument("--mbytes", type=int, default=8)
  ap.add_argument("--learners", type=int, default=4)
  ap.add_argument("--threads", type=int, default=0, help="merge threads per process (0: default)")
  a = ap.parse_args()
  if a.part == "memory":
    memory()
  elif a.part == "throughput":
    throughput(a)
  elif a.part == "one_shard":
    print(json.dumps(one_shard(a.shards, a.shard)))
  else:
    print(json.dumps(merge_loop(a)))


if __name__ == "__main__":
  main()
