"""Chaos on one machine: a synchronizer and M learner processes, SIGKILLed at seeded times.

  python scripts/chaos_local.py --learners=4 --duration_s=300 --kills=12 --seed=0 \
      --workdir=runs/chaos

Kill times are drawn uniformly over the first 85% of the run from the seed; each kill picks the
synchronizer with probability --sync_share, else a random learner, and the killed process is started
again after --down_s seconds. Learners run enough steps to outlast the chaos and checkpoint every
--learner_checkpoint_every steps, so a killed learner resumes from its newest checkpoint. Any
--config.KEY=VALUE flag (e.g. --config.deploy.absent_after_s=5) goes to every process. The report
(printed and written to WORKDIR/chaos_report.json) lists every kill, whether each killed process
came back, each learner restart's resumed step (its newest checkpoint, or None: it started over)
against the last step it logged before the kill, the merges and steps reached, the synchronizer's
generations, whether its last restart restored exactly the checkpointed arrays, the refusals it
counted, whether every logged loss is finite, and how long recovery took
(diloco/chaos/recovery_times.py: per kill, seconds to the first merge after it; the survivors'
longest pause between merges; `scripts/chaos_ray.py` reports the same under Ray).
With --config.outer.sync_shards=S, a synchronizer kill picks one shard (seeded, the learners'
plan unchanged) and the report has each shard's generation, merges and versions; a shard kill's
recovery is counted in that shard's own merges.
"""

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco.chaos import recovery_times  # noqa: E402
from diloco.rpc import local  # noqa: E402


def _rows(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _resumes(learner_dir):
  """Per restart of one learner: the step it resumed from and the last step logged before."""
  starts = _rows(os.path.join(learner_dir, "starts.jsonl"))
  progress = _rows(os.path.join(learner_dir, "progress.jsonl"))
  out = []
  for i, s in enumerate(starts[1:], 1):
    until = starts[i + 1]["time"] if i + 1 < len(starts) else float("inf")
    before = [r["step"] for r in progress if starts[i - 1]["time"] < r["time"] < s["time"]]
    after = [r["step"] for r in progress if s["time"] < r["time"] < until]
    out.append(
        {
            "resumed_step": s["restored_step"],
            "last_logged_before": max(before, default=0),
            "first_logged_after": after[0] if after else None,
        }
    )
  return out


def _recovery(merges_of: dict, kills: list, starts: dict, learners: int) -> dict:
  """recovery_times.recovery: learner kills against every merge; a synchronizer (shard) kill
  against its own merges."""
  times = lambda rows: [{"time": r["wall_time"], "learners": r["learners"]} for r in rows]
  every = sorted((r for rows in merges_of.values() for r in rows), key=lambda r: r["wall_time"])
  learner_kills = [k for k in kills if not k["process"].startswith("sync")]
  out = recovery_times.recovery(times(every), learner_kills, starts, learners)
  for name, rows in merges_of.items():
    mine = [{**k, "process": "sync"} for k in kills if k["process"] == name]
    out["sync_kills"] += recovery_times.recovery(times(rows), mine, starts, learners)["sync_kills"]
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", default="configs/shakespeare.py:mode=decoupled,runlocal")
  ap.add_argument("--learners", type=int, default=4)
  ap.add_argument("--steps", type=int, default=100000)
  ap.add_argument("--duration_s", type=float, default=300.0)
  ap.add_argument("--kills", type=int, default=12)
  ap.add_argument("--sync_share", type=float, default=0.25)
  ap.add_argument("--down_s", type=float, default=2.0)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--learner_checkpoint_every", type=int, default=50)
  ap.add_argument("--workdir", required=True)
  args, extra = ap.parse_known_args()
  config = local.with_arg(
      local.with_arg(args.config, "learners", args.learners), "steps", args.steps
  )
  overrides = (f"--config.outer.learner_checkpoint_every={args.learner_checkpoint_every}", *extra)
  absent = local.load_config(config, overrides).deploy.absent_after_s
  shards = local.load_config(config, overrides).outer.sync_shards
  c = local.LocalCluster(
      config,
      args.learners,
      os.path.abspath(args.workdir),
      overrides=overrides,
      absent_after_s=absent,
      shards=shards,
  )
  plan = recovery_times.kill_plan(
      args.seed, args.duration_s, args.kills, args.learners, args.sync_share
  )
  if shards > 1:  # which shard each synchronizer kill hits (its own stream: the plan is as before)
    pick = random.Random(f"{args.seed}-shards")
    plan = [(t, f"sync{pick.randrange(shards)}" if n == "sync" else n) for t, n in plan]
  kills, report = [], {}
  t0 = time.monotonic()
  try:
    c.start()
    for at, name in plan:
      time.sleep(max(0.0, at - (time.monotonic() - t0)))
      was_alive, killed_at = c.alive(name), time.time()
      c.kill(name)
      time.sleep(args.down_s)
      if name.startswith("sync"):
        c.start_sync(shard=int(name[4:] or 0))
      else:
        c.start_learner(int(name[7:]))
      kills.append(
          {
              "t_s": round(time.monotonic() - t0, 1),
              "time": killed_at,
              "process": name,
              "was_alive": was_alive,
              "back": c.alive(name),
          }
      )
      print(
          f"[{kills[-1]['t_s']:7.1f}s] SIGKILL {name}, restarted: {kills[-1]['back']}", flush=True
      )
    time.sleep(max(0.0, args.duration_s - (time.monotonic() - t0)))
    alive = {n: c.alive(n) for n in c.procs}
  finally:
    c.stop(grace_s=15.0)
  names = [c.sync_name(s) for s in range(shards)]
  merges_of = {
      n: [
          r for r in _rows(os.path.join(c.workdir, n, "metrics.jsonl")) if r.get("event") == "merge"
      ]
      for n in names
  }
  merges = sorted((r for rows in merges_of.values() for r in rows), key=lambda r: r["wall_time"])
  steps = {
      m: [r["step"] for r in _rows(os.path.join(c.workdir, f"learner{m}", "progress.jsonl"))]
      for m in range(args.learners)
  }
  losses = [
      r["loss"]
      for m in range(args.learners)
      for r in _rows(os.path.join(c.workdir, f"learner{m}", "progress.jsonl"))
  ]
  syncs = {}
  for n in names:
    with open(os.path.join(c.workdir, n, "summary.json")) as f:
      syncs[n] = json.load(f)
  resumes = {m: _resumes(os.path.join(c.workdir, f"learner{m}")) for m in range(args.learners)}
  starts = {
      m: [r["time"] for r in _rows(os.path.join(c.workdir, f"learner{m}", "starts.jsonl"))]
      for m in range(args.learners)
  }
  recovery = _recovery(merges_of, kills, starts, args.learners)
  sync = syncs[names[0]]
  report = {
      "duration_s": round(time.monotonic() - t0, 1),
      "kills": kills,
      "kills_total": len(kills),
      "sync_kills": sum(k["process"].startswith("sync") for k in kills),
      "every_killed_process_back": all(k["back"] for k in kills),
      "alive_before_stop": alive,
      "merges_logged": len(merges),
      "sync_generation": sync["generation"],
      "sync_merges": sync["merges"],
      "sync_versions": sync["versions"],
      "restored_arrays_equal": sync.get("restored_arrays_equal"),
      "learner_steps_logged": {m: (max(s) if s else 0) for m, s in steps.items()},
      "learner_restarts": {n: c.starts[n] - 1 for n in c.starts},
      "learner_resumes": resumes,
      # Restarts SIGKILLed again before they had loaded anything (no line in starts.jsonl).
      "learner_restarts_killed_in_startup": {
          m: c.starts.get(f"learner{m}", 1) - 1 - len(resumes[m]) for m in range(args.learners)
      },
      "all_losses_finite": all(l == l and abs(l) != float("inf") for l in losses),
      "loss_first_last": [losses[0], losses[-1]] if losses else None,
      "refusals": sync.get("refusals"),
      **(
          {}
          if shards == 1
          else {
              "shards": {
                  n: {k: s.get(k) for k in ("owned", "generation", "merges", "versions")}
                  | {"restored_arrays_equal": s.get("restored_arrays_equal")}
                  for n, s in syncs.items()
              }
          }
      ),
      "recovery": recovery,
      "recovery_worst": recovery_times.worst(recovery),
  }
  with open(os.path.join(c.workdir, "chaos_report.json"), "w") as f:
    json.dump(report, f, indent=2)
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
