"""A learner process's start: a fresh interpreter against a fork of the preloaded server
(diloco/rpc/forked.py), as LocalCluster starts one.

  python scripts/bench_start.py [--starts=5]

Each start runs a module that imports what `experiments.learner` imports, makes the CPU devices
(`jax.devices()`) and exits, writing its own CPU seconds (os.times: a fork counts from its fork)
and its wall time from the start. Starts alternate, fresh then forked; the server's own start
(its imports, once per launcher process) is timed apart. The last line is
`fork_vs_fresh_cpu=R` (the mean CPU of a forked start over a fresh one's).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from diloco.rpc import forked  # pylint: disable=wrong-import-position

PROBE = """
import json, os, sys, time
import diloco.rpc.learner_main, diloco.rpc.multihost, jax
jax.devices()
t = os.times()
with open(sys.argv[1], "w") as f:
  json.dump({"cpu_s": t.user + t.system, "end": time.time()}, f)
"""


def _one(fork: bool, env: dict, tmp: str, i: int) -> dict:
  out = os.path.join(tmp, f"{'fork' if fork else 'fresh'}{i}.json")
  began = time.time()
  proc = forked.start(["-m", "start_probe", out], env, tmp, os.path.join(tmp, "log"), fork=fork)
  code = proc.wait(300)
  if code != 0:
    raise SystemExit(f"the probe exited with {code}; see {tmp}/log")
  with open(out) as f:
    got = json.load(f)
  return {"cpu_s": got["cpu_s"], "wall_s": got["end"] - began}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--starts", type=int, default=5)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
    with open(os.path.join(tmp, "start_probe.py"), "w") as f:
      f.write(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, REPO]), JAX_PLATFORMS="cpu")
    began = time.time()
    forked.start(["-m", "start_probe", os.path.join(tmp, "warm.json")], env, tmp, os.devnull).wait()
    print(f"server start and a first fork: {time.time() - began:.2f} s wall")
    runs = {True: [], False: []}
    for i in range(args.starts):
      for fork in (False, True):
        runs[fork].append(_one(fork, env, tmp, i))
  for fork, name in ((False, "fresh"), (True, "forked")):
    cpu = statistics.mean(r["cpu_s"] for r in runs[fork])
    wall = statistics.mean(r["wall_s"] for r in runs[fork])
    print(f"{name}: {cpu:.2f} s of CPU, {wall:.2f} s wall a start (mean of {args.starts})")
  ratio = statistics.mean(r["cpu_s"] for r in runs[True]) / statistics.mean(
      r["cpu_s"] for r in runs[False]
  )
  print(f"fork_vs_fresh_cpu={ratio:.3f}")


if __name__ == "__main__":
  main()
