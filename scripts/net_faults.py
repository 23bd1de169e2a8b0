"""Faults the kernel makes between real hosts on this machine (as root): each scenario of
experiments/studies/net_faults.py, and the run without a fault, with their figures.

  sudo python scripts/net_faults.py --workdir=runs/net_faults [--scenarios=clean,learner_partition]

Writes WORKDIR/report.json after each scenario (BENCHMARKS.md, "Faults the kernel makes") and
prints each one's exit codes and merged shares.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco.rpc import netns  # noqa: E402
from experiments.studies import net_faults as nf  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--scenarios", default=",".join(nf.SCENARIOS))
  args = parser.parse_args()
  names = args.scenarios.split(",")
  unknown = [n for n in names if n not in nf.SCENARIOS]
  ran = [n for n in names if os.path.exists(os.path.join(args.workdir, n))]
  why = netns.available()
  if unknown:
    why = f"--scenarios: unknown {unknown}; expected among {sorted(nf.SCENARIOS)}"
  elif ran:  # (a synchronizer would restore the last run's state from it: its counts add up)
    why = f"{args.workdir} already holds a run of {', '.join(ran)}: remove it or pick another"
  if why:
    print(f"error: {why}", file=sys.stderr)
    return 2
  os.makedirs(args.workdir, exist_ok=True)
  path = os.path.join(args.workdir, "report.json")
  report = json.load(open(path)) if os.path.exists(path) else {}
  for name in names:
    report[name] = nf.SCENARIOS[name](os.path.join(args.workdir, name))
    print(name, json.dumps({k: report[name].get(k) for k in ("codes", "merged_share")}), flush=True)
    with open(path, "w") as f:  # (after each: a long run keeps what it did)
      json.dump(report, f, indent=1, default=str)
  return 0


if __name__ == "__main__":
  sys.exit(main())
