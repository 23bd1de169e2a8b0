"""Goodput and uptime of a training job on a failing cluster, over repeated seeds.

Goodput = useful chip-seconds / allocated chip-seconds; uptime = share of time the global model
advances. `simulate` runs one policy on one cluster for several seeds and reports means with 95%
confidence half-widths (Student t over seeds). `run` is what `experiments/simulate_goodput.py`
calls.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import ml_collections
import numpy as np
from scipy import stats

from diloco import paths
from diloco.sim import calibration, failure_policies
from diloco.sim.cluster import Cluster, sample_trace

POLICIES = ("dp", "elastic_dp", "decoupled")


@dataclasses.dataclass(frozen=True)
class Result:
  """One policy on one cluster, aggregated over seeds."""

  policy: str
  chips: int
  learners: int
  quorum: int
  goodput: float
  goodput_ci: float  # 95% half-width over seeds (nan with one seed)
  uptime: float
  uptime_ci: float
  failures: float  # mean failures per seed that hit the job in the horizon
  seeds: int
  per_seed_goodput: tuple[float, ...]
  per_seed_uptime: tuple[float, ...]
  learner_uptime: tuple[float, ...]  # per learner, mean over seeds

  def row(self) -> dict:
    """The JSON row: the figures, without the per-seed lists."""
    out = {k: v for k, v in dataclasses.asdict(self).items() if not k.startswith("per_seed")}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def make_policy(
    name: str,
    *,
    restart_s: float,
    checkpoint_interval_s: float,
    downscale_s: float,
    upscale_s: float,
    learners: int = 1,
    quorum: int = 1,
):
  """The policy object for a name; the only place a policy is chosen by name."""
  if name == "dp":
    return failure_policies.DataParallel(
        restart_s=restart_s, checkpoint_interval_s=checkpoint_interval_s
    )
  if name == "elastic_dp":
    return failure_policies.ElasticDataParallel(downscale_s=downscale_s, upscale_s=upscale_s)
  if name == "decoupled":
    return failure_policies.Decoupled(
        downscale_s=downscale_s, upscale_s=upscale_s, learners=learners, quorum=quorum
    )
  raise ValueError(f"unknown policy {name!r}; expected one of {POLICIES}")


def simulate(cluster: Cluster, policy, seeds: Sequence[int]) -> Result:
  """Runs `policy` on `cluster` once per seed."""
  if len(seeds) < 1:
    raise ValueError("need at least one seed")
  outcomes = [policy.run(sample_trace(cluster, int(s))) for s in seeds]
  return summarize(cluster, policy, outcomes)


def simulate_many(cluster: Cluster, named: Sequence, seeds: Sequence[int]) -> list[Result]:
  """Runs several policies on the same draws (one trace per seed, shared by all policies)."""
  if len(seeds) < 1:
    raise ValueError("need at least one seed")
  per_policy = [[] for _ in named]
  for s in seeds:
    trace = sample_trace(cluster, int(s))
    for out, policy in zip(per_policy, named):
      out.append(policy.run(trace))
  return [summarize(cluster, p, o) for p, o in zip(named, per_policy)]


def summarize(cluster: Cluster, policy, outcomes: Sequence[failure_policies.Outcome]) -> Result:
  horizon = cluster.horizon_s
  good = np.array([o.useful_chip_s for o in outcomes]) / (cluster.chips * horizon)
  up = np.array([o.uptime_s for o in outcomes]) / horizon
  learner_up = np.mean([o.learner_uptime_s for o in outcomes], axis=0) / horizon
  return Result(
      policy=policy.name,
      chips=cluster.chips,
      learners=getattr(policy, "learners", 1),
      quorum=getattr(policy, "quorum", 1),
      goodput=float(good.mean()),
      goodput_ci=half_width(good),
      uptime=float(up.mean()),
      uptime_ci=half_width(up),
      failures=float(np.mean([o.interruptions for o in outcomes])),
      seeds=len(outcomes),
      per_seed_goodput=tuple(good.tolist()),
      per_seed_uptime=tuple(up.tolist()),
      learner_uptime=tuple(learner_up.tolist()),
  )


def half_width(x: np.ndarray, level: float = 0.95) -> float:
  """Half-width of the Student-t confidence interval of the mean of x (nan for one sample)."""
  n = len(x)
  if n < 2:
    return float("nan")
  return float(stats.t.ppf(0.5 + level / 2, n - 1) * np.std(x, ddof=1) / math.sqrt(n))


def cluster_from_config(config: ml_collections.ConfigDict) -> Cluster:
  keys = ("chips", "mtbi_years", "unit_chips", "return_time_s", "speed_std", "days")
  return Cluster(**{k: config[k] for k in keys})


def policies_from_config(config: ml_collections.ConfigDict) -> list:
  """The policies a config asks for: one, or with policy='all' every policy and M in the sweep."""
  timing = dict(
      restart_s=config.restart_s,
      checkpoint_interval_s=config.checkpoint_interval_s,
      downscale_s=config.downscale_s,
      upscale_s=config.upscale_s,
  )
  if config.policy != "all":
    return [make_policy(config.policy, learners=config.learners, quorum=config.quorum, **timing)]
  out = [make_policy("dp", **timing), make_policy("elastic_dp", **timing)]
  for m in config.learners_sweep:
    out.append(
        make_policy("decoupled", learners=int(m), quorum=min(config.quorum, int(m)), **timing)
    )
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
  """Simulates the config's policies, prints the table, writes WORKDIR/goodput.json."""
  if config.seeds < 1:
    raise ValueError(f"seeds must be >= 1, got {config.seeds}")
  cluster = cluster_from_config(config)
  seeds = range(config.seed, config.seed + config.seeds)
  results = simulate_many(cluster, policies_from_config(config), seeds)
  rows = [
      dict(r.row(), published=calibration.published(r.policy, r.learners, cluster)) for r in results
  ]
  print(format_table(rows, cluster))
  print(calibration.describe_params(config))
  paths.write_text(paths.join(workdir, "goodput.json"), json.dumps(rows, indent=1))
  return rows


def format_table(rows: Sequence[dict], cluster: Cluster) -> str:
  """A plain-text table of goodput and uptime, beside the published value where there is one."""
  head = (
      f"{cluster.chips:,} chips, MTBI {cluster.mtbi_years:g} chip-years, {cluster.days:g} "
      f"day(s), {rows[0]['seeds'] if rows else 0} seeds; 95% CI half-widths in points"
  )
  lines = [
      head,
      f"{'policy':<11} {'M':>3} {'K':>3} {'goodput %':>14} {'uptime %':>14} "
      f"{'failures':>9} {'published':>9} {'diff':>6}",
  ]
  worst = 0.0
  for r in rows:
    pub = r.get("published")
    diff = "" if pub is None else f"{100 * (r['goodput'] - pub):+6.1f}"
    worst = max(worst, 0.0 if pub is None else abs(100 * (r["goodput"] - pub)))
    lines.append(
        f"{r['policy']:<11} {r['learners']:>3} {r['quorum']:>3} "
        f"{_pct(r['goodput'], r['goodput_ci']):>14} "
        f"{_pct(r['uptime'], r['uptime_ci']):>14} "
        f"{r['failures']:>9.0f} {'' if pub is None else f'{100 * pub:.0f}':>9} {diff:>6}"
    )
  if any(r.get("published") is not None for r in rows):
    lines.append(f"largest |model - published|: {worst:.1f} points")
  return "\n".join(lines)


def _pct(value: float, ci: float | None) -> str:
  return f"{100 * value:5.1f}" + ("" if ci is None else f" ± {100 * ci:4.1f}")
