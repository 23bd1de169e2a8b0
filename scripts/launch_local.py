"""Starts a synchronizer and M learner processes on this machine, waits, and stops them all.

  python scripts/launch_local.py --config=configs/shakespeare.py:mode=decoupled,runlocal \
      --learners=4 --workdir=runs/local

Logs go to WORKDIR/logs/<name>.log, outputs to WORKDIR/sync and WORKDIR/learner<m>. Ctrl-C (or
--timeout_s) stops every process: SIGTERM, then SIGKILL after a grace period.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco.rpc import local  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--learners", type=int, required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--devices_per_learner", type=int, default=1)
    ap.add_argument("--timeout_s", type=float, default=3600.0)
    args = ap.parse_args()
    c = local.LocalCluster(args.config, args.learners, os.path.abspath(args.workdir),
                           devices_per_learner=args.devices_per_learner)
    try:
        c.start()
        print(f"synchronizer on 127.0.0.1:{c.port}; logs in {c.workdir}/logs", flush=True)
        codes = c.wait(args.timeout_s)
        print("exit codes:", codes, flush=True)
    except KeyboardInterrupt:
        print("stopping", flush=True)
    finally:
        c.stop()


if __name__ == "__main__":
    main()
