"""Starts a synchronizer (or its shards) and M learner processes on this machine, waits, stops all.

  python scripts/launch_local.py --config=configs/shakespeare.py:mode=decoupled,runlocal \
      --learners=4 --workdir=runs/local [--config.deploy.KEY=VALUE ...]

Any --config.KEY=VALUE flag (e.g. --config.deploy.absent_after_s=10) is checked here and passed to
every process. Learners checkpoint every --learner_checkpoint_every steps into
WORKDIR/learner<m>/checkpoints and a learner started again resumes from there. Logs go to
WORKDIR/logs/<name>.log, outputs to WORKDIR/sync and WORKDIR/learner<m>.
A `chaos` schedule (--config.chaos.schedule='straggle learner 1 at t=0s for 1e6s x3; ...') acts
inside the learner processes (diloco/rpc/learner_faults.py); a learner that a `crash` fault ends,
or one of whose processes is killed by a signal, is started again here (every process of a
multi-process learner), waits out the crash and resumes from its checkpoint. WORKDIR may be a
bucket URL (gs://...): the processes' logs then go to a local temporary directory.
With --config.outer.sync_shards=S, S synchronizer processes start (WORKDIR/sync0..sync<S-1>, each
owning its fragments, checkpointing and restartable on its own) and every learner talks to all.
Ctrl-C (or --timeout_s) stops every process: SIGTERM, then SIGKILL after a grace period.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco import paths  # noqa: E402
from diloco.rpc import local  # noqa: E402


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", required=True)
  ap.add_argument("--learners", type=int, required=True)
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--devices_per_learner", type=int, default=1, help="per process")
  ap.add_argument(
      "--processes_per_learner",
      type=int,
      default=1,
      help=">1: each learner is one multi-process JAX job",
  )
  ap.add_argument("--timeout_s", type=float, default=3600.0)
  ap.add_argument(
      "--learner_checkpoint_every",
      type=int,
      default=50,
      help="learners checkpoint every N steps (0: never) and resume from it",
  )
  args, extra = ap.parse_known_args()
  overrides = [
      f"--config.outer.learner_checkpoint_every={args.learner_checkpoint_every}",
      *extra,
  ]  # a --config.outer.learner_checkpoint_every given here comes later, wins
  spec = local.with_arg(args.config, "learners", args.learners)
  config = local.load_config(spec, tuple(overrides))
  c = local.LocalCluster(
      spec,
      args.learners,
      paths.absolute(args.workdir),
      overrides=tuple(overrides),
      devices_per_learner=args.devices_per_learner,
      processes_per_learner=args.processes_per_learner,
      absent_after_s=config.deploy.absent_after_s,
      shards=config.outer.sync_shards,
  )
  try:
    c.start()
    where = ", ".join(f"{c.sync_name(s)} on 127.0.0.1:{p}" for s, p in sorted(c.ports.items()))
    print(f"{where}; logs in {c.logs}", flush=True)
    codes = c.wait(args.timeout_s, restart_crashed=True)
    print("exit codes:", codes, flush=True)
  except KeyboardInterrupt:
    print("stopping", flush=True)
  finally:
    c.stop()


if __name__ == "__main__":
  main()
