"""How a training job reacts to failures: data-parallel, elastic data-parallel, Decoupled DiLoCo.

Each policy turns one seed's `Trace` into an `Outcome`: useful chip-seconds, the time the global
model advances, and the failures that hit the job, all within the measured horizon [0, T).

Shared rules (stated once, used by every policy):
- A pause is triggered by an event that finds the job (or learner) running; events that arrive
  during a pause are handled by that pause at no extra cost (`intervals.absorb_pauses`).
- A synchronous group of chips runs at the speed of its slowest chip; useful chip-seconds are
  chips x running time x that speed, against a nominal mean speed of 1.
- Allocated chip-seconds are chips x T for every policy, so chips of a unit awaiting repair count as
  allocated and idle.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from diloco.sim import intervals
from diloco.sim.cluster import Trace

_SLOWEST_TRACKED = 32  # slowest units per learner whose down time is tracked exactly


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One policy on one seed."""

  useful_chip_s: float
  uptime_s: float  # time in [0, T) during which the global model advances
  interruptions: int  # failures in [0, T) that hit the job
  learner_uptime_s: tuple[float, ...]  # per learner (one entry for dp and elastic_dp)


@dataclasses.dataclass(frozen=True)
class DataParallel:
  """Synchronous SPMD, not elastic: any failure stops everyone for a restart from a checkpoint.

  The failed unit is swapped for a spare during the restart, so the job always holds every chip and
  sees every chip failure. Work since the last checkpoint is lost; checkpoints are taken every
  `checkpoint_interval_s` of progress (0: continuously, nothing is lost).
  """

  restart_s: float
  checkpoint_interval_s: float = 0.0
  name = "dp"

  def __post_init__(self):
    _check_times(restart_s=self.restart_s, checkpoint_interval_s=self.checkpoint_interval_s)

  def run(self, trace: Trace) -> Outcome:
    cluster, horizon = trace.cluster, trace.cluster.horizon_s
    t = trace.raw_t
    p_start, p_end = intervals.absorb_pauses(t, np.full(t.size, self.restart_s))
    resumed = np.r_[-cluster.warmup_s, p_end][: p_start.size]
    progress = p_start - resumed  # training time since the last restart, when a failure stops it
    every = self.checkpoint_interval_s
    lost = np.mod(progress, every) if every else np.zeros_like(progress)
    # Lost work and the pause that follows are contiguous: [start - lost, end).
    wasted = intervals.covered_within(p_start - lost, p_end, 0.0, horizon)
    paused = intervals.covered_within(p_start, p_end, 0.0, horizon)
    speed = float(trace.unit_speed.min())
    uptime = horizon - paused
    return Outcome(
        useful_chip_s=cluster.chips * speed * (horizon - wasted),
        uptime_s=uptime,
        interruptions=int(np.count_nonzero((t >= 0) & (t < horizon))),
        learner_uptime_s=(uptime,),
    )


@dataclasses.dataclass(frozen=True)
class Decoupled:
  """M learners of about N/M chips, each elastic on its own; the model advances while K are up.

  A failure pauses only its learner for `downscale_s`, which then continues without the failed unit;
  when the unit returns the learner pauses for `upscale_s` and takes it back. Learners never wait
  for each other, so all their work counts as useful; the quorum K only decides when the global
  model advances (the uptime).
  """

  downscale_s: float
  upscale_s: float
  learners: int = 8
  quorum: int = 1
  name = "decoupled"

  def __post_init__(self):
    _check_times(downscale_s=self.downscale_s, upscale_s=self.upscale_s)
    if (
        isinstance(self.learners, bool)
        or not isinstance(self.learners, (int, np.integer))
        or self.learners < 1
    ):
      raise ValueError(f"learners must be an integer >= 1, got {self.learners!r}")
    if (
        isinstance(self.quorum, bool)
        or not isinstance(self.quorum, (int, np.integer))
        or not 1 <= self.quorum <= self.learners
    ):
      raise ValueError(
          f"quorum must be an integer in [1, learners={self.learners}], got {self.quorum!r}"
      )

  def run(self, trace: Trace) -> Outcome:
    cluster, horizon = trace.cluster, trace.cluster.horizon_s
    if self.learners > cluster.units:
      raise ValueError(
          f"learners ({self.learners}) exceeds the number of failure units "
          f"({cluster.units} units of {cluster.unit_chips} chips)"
      )
    bounds = np.cumsum(np.r_[0, _split_evenly(cluster.units, self.learners)])
    useful, down, interruptions = 0.0, [], 0
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
      u, d, n = self._run_learner(trace, lo, hi)
      useful += u
      down.append(d)
      interruptions += n
    uptime = intervals.time_with_quorum(down, self.quorum, 0.0, horizon)
    learner_up = tuple(horizon - intervals.covered_within(s, e, 0.0, horizon) for s, e in down)
    return Outcome(
        useful_chip_s=useful,
        uptime_s=uptime,
        interruptions=interruptions,
        learner_uptime_s=learner_up,
    )

  def _run_learner(self, trace: Trace, lo: int, hi: int):
    """Useful chip-seconds, down intervals and failures of the learner on units lo..hi-1."""
    cluster = trace.cluster
    horizon = cluster.horizon_s
    mine = (trace.fail_unit >= lo) & (trace.fail_unit < hi)
    f_t, f_unit = trace.fail_t[mine], trace.fail_unit[mine]
    back_t = f_t + cluster.return_time_s
    t = np.concatenate([f_t, back_t])
    order = np.argsort(t, kind="stable")
    t = t[order]
    delta = np.r_[-np.ones(f_t.size), np.ones(f_t.size)][order]
    dur = np.r_[np.full(f_t.size, self.downscale_s), np.full(f_t.size, self.upscale_s)][order]
    in_sim = t < horizon
    t, delta, dur = t[in_sim], delta[in_sim], dur[in_sim]
    p_start, p_end = intervals.absorb_pauses(t, dur)
    start = min(-cluster.warmup_s, t[0]) if t.size else -cluster.warmup_s  # all units up

    # Segments between consecutive events: the set of up units is constant on each.
    seg_lo = np.r_[start, t]
    seg_hi = np.r_[t, horizon]
    units_up = (hi - lo) + np.r_[0.0, np.cumsum(delta)]
    speed = _learner_speed(trace, lo, hi, f_t, f_unit, seg_lo)
    a, b = np.clip(seg_lo, 0.0, horizon), np.clip(seg_hi, 0.0, horizon)
    paused = intervals.covered_below(p_start, p_end, b) - intervals.covered_below(p_start, p_end, a)
    running = (b - a) - paused
    useful = float(np.sum(running * units_up * cluster.unit_chips * speed))

    empty = units_up == 0  # every unit of the learner down: not advancing either
    down = intervals.merge(np.r_[p_start, seg_lo[empty]], np.r_[p_end, seg_hi[empty]])
    failures = int(np.count_nonzero((f_t >= 0) & (f_t < horizon)))
    return useful, down, failures


@dataclasses.dataclass(frozen=True)
class ElasticDataParallel(Decoupled):
  """Elastic SPMD: one job on every chip; a failure pauses everyone, who continue smaller."""

  learners: int = 1
  quorum: int = 1
  name = "elastic_dp"

  def __post_init__(self):
    super().__post_init__()
    if self.learners != 1 or self.quorum != 1:
      raise ValueError("elastic_dp is a single job: learners and quorum must be 1")


def _learner_speed(
    trace: Trace, lo: int, hi: int, f_t: np.ndarray, f_unit: np.ndarray, seg_lo: np.ndarray
) -> np.ndarray:
  """Speed of the slowest up unit of units [lo, hi) on each segment starting at seg_lo."""
  speeds = trace.unit_speed[lo:hi]
  if np.all(speeds == speeds[0]):
    return np.full(seg_lo.size, speeds[0])
  n = hi - lo
  k = min(n, _SLOWEST_TRACKED)
  slow = np.argpartition(speeds, k - 1)[:k]
  slow = slow[np.argsort(speeds[slow], kind="stable")]
  rank = np.full(n, -1)
  rank[slow] = np.arange(k)
  r = rank[f_unit - lo]
  hit = r >= 0
  # A unit is down on the segments that start in [failure, return).
  first = np.searchsorted(seg_lo, f_t[hit], side="left")
  last = np.searchsorted(seg_lo, f_t[hit] + trace.cluster.return_time_s, side="left")
  count = np.zeros((seg_lo.size + 1, k), dtype=np.int32)
  np.add.at(count, (first, r[hit]), 1)
  np.add.at(count, (last, r[hit]), -1)
  is_down = np.cumsum(count, axis=0)[:-1] > 0
  out = speeds[slow][np.argmax(~is_down, axis=1)]
  for i in np.flatnonzero(is_down.all(axis=1)) if k < n else ():
    # The tracked units are all down at once (practically never): take the exact minimum.
    down_now = (f_t <= seg_lo[i]) & (seg_lo[i] < f_t + trace.cluster.return_time_s)
    up = np.ones(n, dtype=bool)
    up[f_unit[down_now] - lo] = False
    out[i] = speeds[up].min()
  return out


def _split_evenly(units: int, learners: int) -> np.ndarray:
  """Units per learner: as equal as possible, the first ones one larger."""
  q, r = divmod(units, learners)
  return np.r_[np.full(r, q + 1), np.full(learners - r, q)].astype(int)


def _check_times(**times: float) -> None:
  for name, value in times.items():
    if not value >= 0 or not np.isfinite(value):
      raise ValueError(f"{name} must be a non-negative finite number of seconds, got {value!r}")
