"""Host memory of a multi-process learner's copy of the global fragments, per process: python -m
scripts.bench_global_copy [--model=base] [--processes=1,2,4].

For each count P, one learner runs as a JAX job of P processes x 2 CPU devices (gloo, on the
loopback), its parameters sharded over all 2P devices (fsdp). It takes every fragment whole at
version 0, as the reply to its Join gives them (`Learner.receive`). Each process reports the bytes
its copy of the global fragments holds (the arrays' nbytes) and the bytes tracemalloc saw the
receives allocate and keep (numpy reports its buffers to tracemalloc). Printed: per P, the
largest of its processes, and each figure's ratio to P = 1 beside 1/P.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = 2  # CPU devices per process


def _worker(args) -> None:
  from diloco.config import checks
  from diloco.outer import fragments
  from diloco.outer.protocol import Send
  from diloco.rpc import learner_main, local, multihost

  multihost.initialize(False, args.coordinator, args.num_processes, args.process_id)
  spec = f"configs/shakespeare.py:mode=decoupled,runlocal,model={args.model}"
  config = local.load_config(spec, ("--config.mesh.data=-1", "--config.mesh.fsdp=-1"))
  learner = learner_main.make_learner(checks.prepare(config), 0)  # holds nothing yet
  flat = fragments.flatten(learner.state.params)
  params = {k: multihost.host_value(v) for k, v in flat.items()}  # (the Join's reply, whole)
  sends = [
      Send(learner=0, fragment=p, version=0, values={k: params[k] for k in paths})
      for p, paths in enumerate(learner.frag.paths)
  ]
  gc.collect()
  tracemalloc.start()
  before = tracemalloc.get_traced_memory()[0]
  for send in sends:
    learner.receive(send)
  gc.collect()
  kept = tracemalloc.get_traced_memory()[0] - before
  held, whole = learner.copy_bytes()
  sharded = sum(not learner.layout(k).whole for k in flat)
  print(
      "RESULT " + json.dumps(dict(held=held, whole=whole, kept=kept, sharded=sharded)),
      flush=True,
  )


def _job(processes: int, model: str) -> list[dict]:
  from diloco.rpc import local

  port = local.free_port()
  env = {**os.environ, "XLA_FLAGS": local.xla_flags(DEVICES), "JAX_PLATFORMS": "cpu"}
  procs = [
      subprocess.Popen(
          [sys.executable, "-m", "scripts.bench_global_copy", "--worker", f"--model={model}",
           f"--coordinator=127.0.0.1:{port}", f"--num_processes={processes}",
           f"--process_id={i}"],
          cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
      )  # fmt: skip
      for i in range(processes)
  ]
  out = [p.communicate(timeout=900)[0] for p in procs]
  if any(p.returncode for p in procs):
    raise RuntimeError(f"a process of the {processes}-process job failed: {out}")
  return [
      json.loads(line[7:]) for o in out for line in o.splitlines() if line.startswith("RESULT ")
  ]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", default="base")
  parser.add_argument("--processes", default="1,2,4")
  parser.add_argument("--worker", action="store_true")
  parser.add_argument("--coordinator", default="")
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  args = parser.parse_args()
  if args.worker:
    return _worker(args)
  rows = {}
  for n in (int(x) for x in args.processes.split(",")):
    results = _job(n, args.model)
    rows[n] = {k: max(r[k] for r in results) for k in results[0]}
  first = rows[min(rows)]
  mib = lambda b: f"{b / 2**20:8.2f}"
  print(f"model={args.model}: the whole copy is {mib(first['whole'])} MiB (float32)")
  print("processes  held MiB  kept MiB  held ratio  kept ratio  1/P   sharded")
  for n, r in rows.items():
    print(
        f"{n:9d}  {mib(r['held'])}  {mib(r['kept'])}"
        f"  {r['held'] / first['held']:10.3f}  {r['kept'] / first['kept']:10.3f}"
        f"  {1 / n:5.3f}  {r['sharded']:3d}"
    )


if __name__ == "__main__":
  main()
