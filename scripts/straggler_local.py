"""One learner 3x slower, in real processes: do the others slow down with it?

  python scripts/straggler_local.py [--steps=60] [--diloco_inner_steps=20] [--factor=3] [--modes=decoupled,diloco] \
      [--config=configs/shakespeare.py:model=small] --workdir=runs/straggler

For each mode, a synchronizer and M=3 learner processes of the `small` model run twice on this
machine (synchronous DiLoCo with H=--diloco_inner_steps, as in torchft's comparison; Decoupled
DiLoCo with its preset's P=H=24) (scripts/launch_local.py's cluster): once with every learner at speed 1, once with the last
learner straggling by --factor for the whole run (a chaos `straggle` fault acting inside its process,
diloco/rpc/learner_faults.py). A learner's speed is its steps per second between its first logged
step past --warmup and its last; the script prints, per mode, the fast learners' (0..M-2) mean speed
with the straggler over their speed without it, and last `fast_learners_with_straggler=X` for the
first mode. A run ends when the fast learners have finished (the straggler is stopped then: its
speed needs only its log so far). Every process's logs and outputs stay under WORKDIR/<mode>/<speed|straggler>/.

On a machine with fewer cores than processes the learners also compete for the CPU, so a straggler
that sleeps frees cores for the others and the ratio can exceed 1 there; --busy makes the straggler
spin through its extra time instead (deploy.straggle_busy), which keeps one core as busy as before.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco.rpc import local  # noqa: E402


def speed(learner_dir: str, warmup: int) -> float:
  """Steps per second of one learner between its first logged step past `warmup` and its last
  (its progress.jsonl; the last process start only)."""
  with open(os.path.join(learner_dir, "progress.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  rows = [r for r in rows if r["step"] > warmup]
  if len(rows) < 2:
    raise RuntimeError(f"{learner_dir}: fewer than two logged steps past step {warmup}")
  a, b = rows[0], rows[-1]
  return (b["step"] - a["step"]) / (b["time"] - a["time"])


def run_once(args, mode: str, straggle: bool) -> list[float]:
  """Every learner's speed in one run."""
  m = args.learners
  spec = local.with_arg(local.with_arg(args.config, "mode", mode), "learners", m)
  overrides = [f"--config.steps={args.steps}", "--config.log_every=5"]
  if mode == "diloco":  # torchft's comparison synced every 20 steps
    overrides.append(f"--config.outer.inner_steps={args.diloco_inner_steps}")
  overrides += ["--config.outer.learner_checkpoint_every=0", "--config.progress_bar=False"]
  overrides.append(f"--config.deploy.straggle_busy={args.busy}")
  if straggle:
    fault = f"straggle learner {m - 1} at t=0s for 1000000s x{args.factor:g}"
    overrides.append(f"--config.chaos.schedule={fault}")
  workdir = os.path.join(args.workdir, mode, "straggler" if straggle else "speed")
  local.load_config(spec, tuple(overrides))  # a bad flag fails before anything starts
  c = local.LocalCluster(spec, m, os.path.abspath(workdir), overrides=tuple(overrides))
  fast = [f"learner{i}" for i in range(m - 1)]
  try:
    c.start()
    deadline = time.monotonic() + args.timeout_s
    while time.monotonic() < deadline and any(c.alive(n) for n in fast):
      time.sleep(0.5)
    # The straggler's speed needs only its log so far: it is stopped with the rest.
    speeds = [speed(os.path.join(workdir, f"learner{i}"), args.warmup) for i in range(m)]
  finally:
    c.stop()
  codes = {n: c.procs[n].returncode for n in fast}
  if any(code != 0 for code in codes.values()):
    raise RuntimeError(f"{mode}: exit codes {codes}; see {workdir}/logs")
  return speeds


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", default="configs/shakespeare.py:model=small")
  ap.add_argument("--modes", default="decoupled,diloco")
  ap.add_argument("--learners", type=int, default=3)
  ap.add_argument("--steps", type=int, default=60)
  ap.add_argument("--diloco_inner_steps", type=int, default=20, help="H of mode=diloco")
  ap.add_argument("--warmup", type=int, default=15, help="steps left out of the speed")
  ap.add_argument("--factor", type=float, default=3.0)
  ap.add_argument(
      "--busy",
      action="store_true",
      help="the straggler spins on a core instead of sleeping (keeps the CPU as busy as before)",
  )
  ap.add_argument("--timeout_s", type=float, default=1800.0)
  ap.add_argument("--workdir", required=True)
  args = ap.parse_args()
  results = {}
  for mode in args.modes.split(","):
    base, slow = run_once(args, mode, False), run_once(args, mode, True)
    fast = range(args.learners - 1)
    ratio = sum(slow[i] for i in fast) / sum(base[i] for i in fast)
    results[mode] = dict(speed=base, straggler=slow, fast_learners_with_straggler=ratio)
    print(
        f"{mode}: steps/s without straggler {', '.join(f'{v:.2f}' for v in base)}; with "
        f"learner {args.learners - 1} x{args.factor:g} slower {', '.join(f'{v:.2f}' for v in slow)}"
        f"; fast learners {ratio:.3f}",
        flush=True,
    )
  with open(os.path.join(args.workdir, "straggler_report.json"), "w") as f:
    json.dump(results, f, indent=1)
  first = args.modes.split(",")[0]
  print(f"fast_learners_with_straggler={results[first]['fast_learners_with_straggler']:.3f}")


if __name__ == "__main__":
  main()
