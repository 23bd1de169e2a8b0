"""Chaos under Ray on one machine: a local Ray cluster, experiments.launch_ray, SIGKILLs by PID.

  python scripts/chaos_ray.py --learners=2 --duration_s=150 --kills=4 --seed=0 --workdir=DIR

The kill schedule is scripts/chaos_local.py's for the same seed (diloco/chaos/recovery_times.py:
kill_plan); here nothing is restarted by hand: the Ray driver notices the failed task and submits
it again after deploy.restart_backoff_s (set to --down_s, chaos_local's pause before a restart).
Learners checkpoint every --learner_checkpoint_every steps and run enough steps to outlast the
chaos; after --duration_s the launcher is stopped. The report (printed, and written to
WORKDIR/chaos_report.json) lists the kills, the restarts Ray's driver made, merges, each
learner's resumed steps, and how long recovery took: per learner kill, seconds to the restarted
process and to its first merge; per synchronizer kill, seconds to the next merge; the survivors'
longest pause between merges. Any --config.KEY=VALUE flag goes to every process.
"""

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco.chaos import recovery_times  # noqa: E402
from diloco.launch import ray_local  # noqa: E402
from diloco.rpc import local  # noqa: E402


def _kill(workdir: str, name: str) -> dict:
  """SIGKILLs `name`'s current process if it runs (a process still restarting is not there)."""
  record = {"time": time.time(), "process": name, "was_alive": False}
  proc = ray_local.state(workdir).get("procs", {}).get(name)
  if proc:
    try:
      os.kill(proc["pid"], signal.SIGKILL)
      record.update(was_alive=True, pid=proc["pid"])
    except ProcessLookupError:
      pass
  return record


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", default="configs/shakespeare.py:mode=decoupled,runlocal")
  ap.add_argument("--learners", type=int, default=2)
  ap.add_argument("--steps", type=int, default=100000)
  ap.add_argument("--duration_s", type=float, default=150.0)
  ap.add_argument("--kills", type=int, default=4)
  ap.add_argument("--sync_share", type=float, default=0.25)
  ap.add_argument("--down_s", type=float, default=2.0)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--learner_checkpoint_every", type=int, default=50)
  ap.add_argument("--workdir", required=True)
  args, extra = ap.parse_known_args()
  workdir = os.path.abspath(args.workdir)
  config = local.with_arg(
      local.with_arg(args.config, "learners", args.learners), "steps", args.steps
  )
  flags = (
      f"--config.outer.learner_checkpoint_every={args.learner_checkpoint_every}",
      f"--config.deploy.restart_backoff_s={args.down_s}",
      *extra,
  )
  local.load_config(config, flags)  # a bad flag fails here, before Ray starts
  plan = recovery_times.kill_plan(
      args.seed, args.duration_s, args.kills, args.learners, args.sync_share
  )
  kills = []
  os.makedirs(workdir, exist_ok=True)
  with ray_local.cluster(num_cpus=args.learners + 2) as address:
    proc = ray_local.launch(
        address, config, args.learners, workdir, *flags, log=os.path.join(workdir, "launch.log")
    )
    try:
      # The schedule's clock starts when every learner has logged a step (as chaos_local's
      # starts at launch, its processes start at once; here Ray's workers take a while).
      ray_local.wait_for(
          lambda: all(
              ray_local.rows(f"{workdir}/learner{m}/progress.jsonl") for m in range(args.learners)
          ),
          300,
          proc=proc,
      )
      t0 = time.monotonic()
      for at, name in plan:
        time.sleep(max(0.0, at - (time.monotonic() - t0)))
        kills.append(_kill(workdir, name))
        print(f"[{time.monotonic() - t0:7.1f}s] SIGKILL {name}", flush=True)
      time.sleep(max(0.0, args.duration_s - (time.monotonic() - t0)))
    finally:
      proc.terminate()
      proc.wait(30)
  state = ray_local.state(workdir)
  merges = ray_local.merges(workdir)
  rec = recovery_times.recovery(
      merges, kills, ray_local.starts(workdir, args.learners), args.learners
  )
  report = {
      "kills": kills,
      "ray_restarts": state.get("restarts"),
      "merges_logged": len(merges),
      "learner_restored_steps": {
          m: [r["restored_step"] for r in ray_local.rows(f"{workdir}/learner{m}/starts.jsonl")]
          for m in range(args.learners)
      },
      "recovery": rec,
      "recovery_worst": recovery_times.worst(rec),
  }
  with open(os.path.join(workdir, "chaos_report.json"), "w") as f:
    json.dump(report, f, indent=2)
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
