"""What a multi-learner virtual run reports: its summary keys (documented in docs/running.md), what
its faults did, its uptime, and the bytes data-parallel would have sent."""

import collections
from typing import Any

import ml_collections
import numpy as np

from diloco import metrics
from diloco.chaos import schedule as chaos
from diloco.config import build
from diloco.outer.learner.learner import Learner
from diloco.runtime import virtual
from diloco.watch import timeline


def dp_bytes_per_token(num_params: int, learners: int, tokens_per_round: int) -> float:
  """Ring all-reduce of fp32 gradients: each of M workers sends and receives 2(M−1)/M of them."""
  per_worker = 2.0 * (learners - 1) / learners * 4 * num_params
  return 2 * learners * per_worker / tokens_per_round


def per_learner(learners: list[Learner], runtime, merges: list[dict]) -> list[dict[str, Any]]:
  """Each learner's steps, tokens, simulated idle and busy seconds, bytes, merges joined, and
  where its work went (`metrics.merged_shares`: steps and tokens that reached a merge)."""
  clocks, work = runtime.clocks, metrics.learner_work(learners, runtime.sync)
  return [
      {
          "steps": l.steps,
          "tokens": l.tokens,
          "idle_s": c.idle_s,
          "busy_s": c.busy_s,
          "bytes_up": up,
          "bytes_down": down,
          "merges_joined": sum(m in r["learners"] for r in merges),
          **{k: v for k, v in work[str(m)].items() if k != "trained_steps"},
      }
      for m, (l, c, up, down) in enumerate(
          zip(learners, clocks, runtime.bytes_up, runtime.bytes_down)
      )
  ]


def summary(
    config: ml_collections.ConfigDict,
    parts: build.Parts,
    runtime,
    log,  # island_log.RunLog: the learners, merges and rejections it kept
    evals: list[dict],  # the global model's evaluations (island_log.GlobalEvals.rows)
    final: dict[str, float],
    sim_time: float,
    wall: float,
) -> dict[str, Any]:
  """The summary keys of a multi-learner run (documented in docs/running.md)."""
  o, learners, merges, clocks = config.outer, log.learners, log.merges, runtime.clocks
  tokens = sum(l.tokens for l in learners)
  sent, received = sum(runtime.bytes_up), sum(runtime.bytes_down)
  isl, allocated = parts.islands[0], o.learners * sim_time
  rows = per_learner(learners, runtime, merges)
  return {
      "mode": config.mode,
      "runtime": "virtual",
      "learners": o.learners,
      "finished": True,
      "steps": max(l.steps for l in learners),
      "tokens": tokens,
      "params": isl.param_count,
      "flops_per_token": isl.flops_per_token,
      **final,  # eval_loss, and eval_bpb (text) or eval_accuracy (images)
      "wall_s": wall,
      "tokens_per_s": tokens / wall,
      "outer_steps": len(merges),
      "merges": len(merges),
      "bytes_sent": sent,
      "bytes_received": received,
      "bytes_per_token": (sent + received) / max(tokens, 1),
      "dp_bytes_per_token": dp_bytes_per_token(
          isl.param_count, o.learners, sum(parts.batches) * config.seq_len
      ),
      "sim_time_s": sim_time,
      "goodput": sum(c.busy_s - c.wasted_s for c in clocks) / allocated if allocated else 0.0,
      "uptime": uptime(merges, sim_time, merge_period_s(config)),
      "mean_quorum": float(np.mean([r["quorum"] for r in merges])) if merges else 0.0,
      "mean_staleness": (
          float(np.mean([s for r in merges for s in r["staleness"]])) if merges else 0.0
      ),
      "per_learner": rows,
      "merged_share": metrics.merged_share(rows),
      "merge_clock": runtime.sync.merge_clock_summary() if runtime.sync is not None else None,
      "eval_curve": [{"sim_time_s": r["sim_time_s"], "eval_loss": r["eval_loss"]} for r in evals],
      "rejected": dict(sorted(log.rejected.items())),
      "merges_skipped": runtime.sync.rounds_skipped,
      "faults": {},
      "rejoins": 0,
      "synchronizer_restarts": 0,
      "stacked": parts.stack_stats(),
  }


def chaos_summary(
    runtime: virtual.VirtualRuntime, faults: list[chaos.Fault], sim_time: float
) -> dict[str, Any]:
  """Summary keys of a run with faults (documented in docs/running.md): what its
  `virtual_chaos.Chaos` counted."""
  st = runtime.faults.stats
  crashes = st.crashes
  rejoined = [c for c in crashes if c["rejoined"] is not None]
  to_rejoin = [c["rejoined"] - c["back"] for c in rejoined]
  down = collections.Counter()
  for c in crashes:
    down[c["learner"]] += (c["rejoined"] if c["rejoined"] is not None else sim_time) - c["time"]
  params = runtime.sync.global_params()
  tainted = {k: dict(sorted(v.items())) for k, v in sorted(st.tainted.items())}
  return {
      "faults": dict(sorted(st.faults.items())),
      "rejoins": len(rejoined),
      "synchronizer_restarts": len(st.restarts),
      "merges_skipped": st.merges_skipped + runtime.sync.rounds_skipped,
      "chaos": {
          # generated schedules run past the end (chaos.SPAN); count those the run reached
          "faults_scheduled": sum(f.time_s < sim_time for f in faults),
          "faults_ignored": st.ignored,
          "faults_unused": st.unused,
          "crashes": len(crashes),
          # ... those back before the end, unless the synchronizer was down from then on
          "every_crashed_learner_rejoined": all(
              c["rejoined"] is not None
              for c in crashes
              if c["back"] <= sim_time and not c.get("sync_down_at_end")
          ),
          "down_at_end": sum(c["rejoined"] is None for c in crashes),
          "learner_downtime_s": float(sum(down.values())),
          "time_to_rejoin_s": {
              "mean": float(np.mean(to_rejoin)) if to_rejoin else 0.0,
              "max": float(max(to_rejoin, default=0.0)),
          },
          "restored_from_checkpoint": sum(c["restored_step"] is not None for c in crashes),
          "steps_lost": int(sum(st.steps_lost)),
          "synchronizer_downtime_s": float(
              sum(min(r["back"], sim_time) - r["time"] for r in st.restarts)
          ),
          "merges_lost": int(
              sum(r["merges"] - r["restored"] for r in st.restarts if r["restored"] is not None)
          ),
          "resyncs": st.resyncs,
          "stalls_broken": st.stalls_broken,
          "messages_dropped": dict(sorted(st.dropped.items())),
          "refused_by_learners": dict(sorted(st.refused_by_learners.items())),
          "tainted": tainted,
          "tainted_merged": sum(v.get("merged", 0) for v in tainted.values()),
          "global_params_finite": bool(all(np.isfinite(v).all() for v in params.values())),
          "per_learner_downtime_s": [float(down[m]) for m in range(len(runtime.learners))],
      },
  }


def merge_period_s(config: ml_collections.ConfigDict) -> float:
  """The nominal time between two merges, H·step_s/P: longer gaps are the model stalling."""
  return config.outer.inner_steps * config.sim.step_s / config.outer.fragments


def uptime(merges: list[dict], sim_time: float, period_s: float) -> float:
  """Share of the simulated time in which the global model advanced.

  Time counts as stalled when the gap between two merges (or from the start to the first, or from
  the last to the end) exceeds the nominal merge period H·step_s/P; the excess is the stall.
  """
  if sim_time <= 0:
    return 0.0
  stalls = timeline.stalled_spans([r["time"] for r in merges], sim_time, period_s)
  return max(0.0, 1.0 - sum(b - a for a, b in stalls) / sim_time)
