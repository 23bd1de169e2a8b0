"""The simulated cluster: chips grouped in failure units, Poisson failures, repairs, chip speeds.

One call to `sample_trace` draws everything random about one seed of one cluster, vectorised over
chips and failure events (never a Python object per chip), so that every policy can be run on the
same draws (common random numbers: `elastic_dp` and one-learner `decoupled` see the same world).

Failure model. Every chip fails as a Poisson process with rate 1/MTBI. A failure takes out its whole
unit (a host or a slice of `unit_chips` chips) for `return_time_s`, after which the unit comes back
repaired. Chips of a unit that is down do not fail again (they are not running), so the failures a
unit suffers form an alternating renewal process: up for Exp(MTBI/unit_chips), down for the return
time. We draw it exactly by thinning: a Poisson stream of rate chips/MTBI with a uniform unit for
each event, where an event that lands on a unit still down is dropped. The simulation starts
`warmup_s` before time 0 in the stationary state of that process (each unit down with probability
R/(R + MTBI/unit_chips), for a remaining time uniform in [0, R)), so that jobs settle into their own
steady state before time 0; only [0, horizon) is measured.

Speed model. Each chip has a persistent speed factor 1 + speed_std * z, z ~ N(0, 1) (nominal mean
1). A synchronous group runs at the speed of its slowest member, so only each unit's slowest chip
matters once the draw is made: `unit_speed` holds it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SECONDS_PER_YEAR = 365.25 * 86400.0
SECONDS_PER_DAY = 86400.0
_MIN_SPEED = 0.05  # floor on a chip's speed factor, so an extreme draw cannot stop a group


@dataclasses.dataclass(frozen=True)
class Cluster:
  """What the hardware does, independent of how the job reacts to it."""

  chips: int
  mtbi_years: float = 1.0  # mean time between interruptions, per chip
  unit_chips: int = 4  # chips a failure takes out (one host)
  return_time_s: float = 4 * 3600.0  # time until a failed unit is back
  speed_std: float = 0.0  # relative std of a chip's speed
  days: float = 1.0  # measured horizon

  def __post_init__(self):
    _check_int("chips", self.chips, 1)
    _check_int("unit_chips", self.unit_chips, 1)
    if self.chips % self.unit_chips:
      raise ValueError(f"chips ({self.chips}) must be a multiple of unit_chips ({self.unit_chips})")
    _check_positive("mtbi_years", self.mtbi_years)
    _check_positive("days", self.days)
    _check_nonnegative("return_time_s", self.return_time_s)
    _check_nonnegative("speed_std", self.speed_std)

  @property
  def units(self) -> int:
    return self.chips // self.unit_chips

  @property
  def horizon_s(self) -> float:
    return self.days * SECONDS_PER_DAY

  @property
  def failure_rate_per_s(self) -> float:
    """Failures per second of the whole cluster when every unit is up."""
    return self.chips / (self.mtbi_years * SECONDS_PER_YEAR)

  @property
  def warmup_s(self) -> float:
    """Simulated time before 0, for the job's pauses to reach their steady state."""
    return 3600.0

  @property
  def down_fraction(self) -> float:
    """Stationary probability that a unit is down."""
    up_mean_s = self.mtbi_years * SECONDS_PER_YEAR / self.unit_chips
    return self.return_time_s / (self.return_time_s + up_mean_s)

  def expected_failures(self) -> float:
    """Expected effective failures (units hit while up) in the horizon, in the steady state."""
    return self.failure_rate_per_s * self.horizon_s * (1.0 - self.down_fraction)


@dataclasses.dataclass(frozen=True)
class Trace:
  """One seed's draw: every chip failure, the ones that took a unit down, and unit speeds.

  Times are seconds, sorted. `raw_*` are all chip failures in [-warmup, horizon) (what a job that
  swaps in spares sees); `fail_*` are the failures that hit a unit while it was up, each followed by
  its return at fail_t + return_time_s; they include, before -warmup, the failures of the units that
  are down when the simulation starts.
  """

  cluster: Cluster
  raw_t: np.ndarray
  raw_unit: np.ndarray
  fail_t: np.ndarray
  fail_unit: np.ndarray
  unit_speed: np.ndarray  # [units], the slowest chip of each unit


def sample_trace(cluster: Cluster, seed: int) -> Trace:
  """Draws the failures and chip speeds of one seed."""
  rng = np.random.default_rng(seed)
  start, end = -cluster.warmup_s, cluster.horizon_s
  count = rng.poisson(cluster.failure_rate_per_s * (end - start))
  raw_t = np.sort(rng.uniform(start, end, size=count))
  raw_unit = rng.integers(0, cluster.units, size=count)
  # Units down at the start: they failed up to one return time before it.
  down0 = np.flatnonzero(rng.random(cluster.units) < cluster.down_fraction)
  down0_t = np.sort(start - cluster.return_time_s * rng.random(down0.size))
  t = np.r_[down0_t, raw_t]
  unit = np.r_[rng.permutation(down0), raw_unit]
  keep = _thin(t, unit, cluster.return_time_s)
  return Trace(
      cluster=cluster,
      raw_t=raw_t,
      raw_unit=raw_unit,
      fail_t=t[keep],
      fail_unit=unit[keep],
      unit_speed=_unit_speeds(cluster, rng),
  )


def _thin(t: np.ndarray, unit: np.ndarray, return_time_s: float) -> np.ndarray:
  """Mask of failures that find their unit up (not within return_time_s of its last failure)."""
  keep = np.ones(t.size, dtype=bool)
  if t.size < 2 or return_time_s <= 0:
    return keep
  order = np.lexsort((t, unit))  # by unit, then time
  t_u, unit_u = t[order], unit[order]
  same = np.r_[False, unit_u[1:] == unit_u[:-1]]
  gap = np.r_[np.inf, np.diff(t_u)]
  # A failure more than a return time after the previous one of its unit always finds it up
  # (whether or not that one counted). Only the close ones need the sequential rule.
  close = np.flatnonzero(same & (gap < return_time_s))
  keep_u = np.ones(t.size, dtype=bool)
  for i in close:  # few: two failures of one unit within a return time
    j = i - 1
    while not keep_u[j]:  # the previous kept failure of this unit (its first one always is)
      j -= 1
    keep_u[i] = t_u[i] - t_u[j] >= return_time_s
  keep[order] = keep_u
  return keep


def _unit_speeds(cluster: Cluster, rng: np.random.Generator) -> np.ndarray:
  """The slowest chip's speed factor in each unit, from one draw per chip."""
  if cluster.speed_std == 0:
    return np.ones(cluster.units)
  z = rng.standard_normal(cluster.chips, dtype=np.float32)
  slowest = z.reshape(cluster.units, cluster.unit_chips).min(axis=1).astype(np.float64)
  return np.maximum(1.0 + cluster.speed_std * slowest, _MIN_SPEED)


def _check_int(name: str, value, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_positive(name: str, value: float) -> None:
  if not value > 0 or not np.isfinite(value):
    raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_nonnegative(name: str, value: float) -> None:
  if not value >= 0 or not np.isfinite(value):
    raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
