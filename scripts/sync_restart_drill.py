"""One synchronizer restart, on purpose: where the learners' work goes (issue 49, point 3).

  python scripts/sync_restart_drill.py --learners=2 --kill_at_step=375 --down_s=5 \
      --workdir=runs/drill --config.steps=1500

Starts the README's gRPC run (a synchronizer and M learner processes, `mode=decoupled,runlocal`
unless --config says otherwise), SIGKILLs the synchronizer once learner 0 has logged
--kill_at_step, starts it again with the same command --down_s seconds later and waits for the
run to end. With --baseline it first runs the same command without the kill, in WORKDIR/baseline.
Prints (and writes to WORKDIR/drill_report.json) the exit codes, the synchronizer's restored step,
generation and final merges, and per learner the steps it trained while unjoined, what it could
not deliver, and its trained steps and merged share as the synchronizer's summary counts them.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco import jsonl  # noqa: E402
from diloco.rpc import local  # noqa: E402


def _json(path):
  with open(path) as f:
    return json.load(f)


def _logged_step(workdir: str, m: int) -> int:
  path = os.path.join(workdir, f"learner{m}", "progress.jsonl")
  rows = jsonl.read(path) if os.path.exists(path) else []  # (a torn last line is dropped)
  return rows[-1]["step"] if rows else 0


def _report(c: local.LocalCluster, codes: dict, learners: int) -> dict:
  sync = _json(os.path.join(c.workdir, "sync", "summary.json"))
  out = {
      "exit_codes": codes,
      "restored_from": sync.get("restored_from"),
      "generation": sync["generation"],
      "merges": sync["merges"],
      "restore_s": sync.get("restore_s"),
      "checkpoints": sync.get("checkpoints"),
      "learners": {},
  }
  for m in range(learners):
    s = _json(os.path.join(c.workdir, f"learner{m}", "summary.json"))
    work = sync.get("learners", {}).get(str(m), {})
    out["learners"][m] = {
        "steps": s["steps"],
        "settled": s["settled"],
        "unreachable_steps": s["unreachable_steps"],
        "undelivered_steps": s.get("undelivered_steps"),
        "trained_steps": work.get("trained_steps"),
        "merged_share": work.get("merged_share"),
    }
  return out


def _run(args, overrides, workdir: str, kill: bool) -> dict:
  c = local.LocalCluster(args.config, args.learners, workdir, overrides=tuple(overrides))
  try:
    c.start()
    killed = None
    if kill:
      deadline = time.monotonic() + args.timeout_s
      while _logged_step(workdir, 0) < args.kill_at_step:
        if time.monotonic() > deadline or not c.alive("learner0"):
          raise RuntimeError(f"learner 0 never logged step {args.kill_at_step}")
        time.sleep(0.05)
      c.kill("sync")
      killed = {m: _logged_step(workdir, m) for m in range(args.learners)}
      time.sleep(args.down_s)
      c.start_sync()
    codes = c.wait(args.timeout_s)
  finally:
    c.stop(grace_s=5.0)
  report = _report(c, codes, args.learners)
  report["killed_at_logged_steps"] = killed
  return report


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/shakespeare.py:mode=decoupled,runlocal")
  parser.add_argument("--learners", type=int, default=2)
  parser.add_argument("--kill_at_step", type=int, default=375)
  parser.add_argument("--down_s", type=float, default=5.0)
  parser.add_argument("--timeout_s", type=float, default=900.0)
  parser.add_argument("--baseline", action="store_true", help="also run it without the kill")
  parser.add_argument("--workdir", required=True)
  args, overrides = parser.parse_known_args()
  args.config = local.with_arg(args.config, "learners", args.learners)
  report = {}
  if args.baseline:
    report["baseline"] = _run(args, overrides, os.path.join(args.workdir, "baseline"), kill=False)
  report["drill"] = _run(args, overrides, os.path.join(args.workdir, "drill"), kill=True)
  text = json.dumps(report, indent=2)
  print(text)
  with open(os.path.join(args.workdir, "drill_report.json"), "w") as f:
    f.write(text + "\n")


if __name__ == "__main__":
  main()
