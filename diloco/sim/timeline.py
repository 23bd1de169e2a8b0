"""A per-layer timeline of one learner's steps: forward, backward, and the link that carries syncs.

The learner computes layer by layer: forward 0..L-1, then backward L-1..0, each layer taking an
equal share of the step's forward or backward time. A layer that syncs at a step puts its payload on
the link as soon as its backward is done (the reduction overlaps the rest of the backward pass), in
the order the layers finish; the link is FIFO and carries one payload at a time at the given
bandwidth. The synced values are needed by that layer's forward `tau` steps later (tau = 0: the next
step), so a late arrival stalls the forward. With a `down` payload the sync is a round trip through
a central synchronizer (upload, then download on the other direction of a full-duplex link); without
one it is an all-reduce whose per-learner traffic the caller has already put in `up_bits`.

Compute utilization = compute time / wall-clock time over whole periods in the steady state.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Workload:
  """The model and its step: parameters split evenly over layers, forward a third of the step."""

  model_params: float
  layers: int
  step_time_s: float
  forward_fraction: float = 1.0 / 3.0

  def __post_init__(self):
    if not self.model_params > 0:
      raise ValueError(f"model_params must be positive, got {self.model_params!r}")
    if (
        isinstance(self.layers, bool)
        or not isinstance(self.layers, (int, np.integer))
        or self.layers < 1
    ):
      raise ValueError(f"layers must be an integer >= 1, got {self.layers!r}")
    if not self.step_time_s > 0 or not np.isfinite(self.step_time_s):
      raise ValueError(f"step_time_s must be a positive finite number, got {self.step_time_s!r}")
    if not 0 < self.forward_fraction < 1:
      raise ValueError(f"forward_fraction must be in (0, 1), got {self.forward_fraction!r}")

  @property
  def params_per_layer(self) -> int:
    return int(round(self.model_params / self.layers))


@dataclasses.dataclass(frozen=True)
class SyncPlan:
  """What a method sends: per step of its period, the layers that sync, and their payloads."""

  period: int  # steps
  layers_at: tuple[tuple[int, ...], ...]  # [period]: layers whose sync starts at that step
  up_bits: np.ndarray  # [layers]: bits a learner sends per sync of each layer
  down_bits: np.ndarray | None  # [layers]: bits it receives back (a synchronizer), or None
  tau: int  # overlap: the synced values are needed `tau` steps after the next one starts

  def bits_per_period(self) -> float:
    """Bits a learner sends in one period (and receives, with a synchronizer)."""
    return float(sum(self.up_bits[list(ls)].sum() for ls in self.layers_at if ls))


def utilization(work: Workload, plan: SyncPlan, gbit_per_s: float, periods: int = 2) -> float:
  """Compute utilization in the steady state, at a link bandwidth of gbit_per_s."""
  if not gbit_per_s > 0:
    raise ValueError(f"bandwidth must be positive, got {gbit_per_s!r}")
  n_layers, step = work.layers, work.step_time_s
  fwd = work.forward_fraction * step / n_layers
  bwd = (1.0 - work.forward_fraction) * step / n_layers
  bps = gbit_per_s * 1e9
  up_s, down_s = plan.up_bits / bps, None if plan.down_bits is None else plan.down_bits / bps
  warm = 2 * plan.period + plan.tau + 2
  steps = warm + periods * plan.period
  rank = np.arange(n_layers)
  clock, up_free, down_free = 0.0, 0.0, 0.0
  needs: dict[int, np.ndarray] = {}  # step -> [layers] earliest forward start per layer
  start_clock = 0.0
  for s in range(steps):
    if s == warm:
      start_clock = clock
    need = needs.pop(s, None)
    layers = plan.layers_at[s % plan.period]
    if need is None and not layers:
      clock += step
      continue
    if need is None:
      fwd_end = clock + n_layers * fwd
    else:  # forward end of layer l = (l+1) fwd + max over j <= l of (start bound of j - j fwd)
      bound = need - rank * fwd
      bound[0] = max(bound[0], clock)
      fwd_end = float(n_layers * fwd + np.maximum.accumulate(bound)[-1])
    clock = fwd_end + n_layers * bwd
    if not layers:
      continue
    ls = np.array(sorted(layers, reverse=True))  # backward finishes the last layer first
    ready = fwd_end + (n_layers - ls) * bwd
    arrive, up_free = _fifo(ready, up_s[ls], up_free)
    if down_s is not None:
      arrive, down_free = _fifo(arrive, down_s[ls], down_free)
    due = s + 1 + plan.tau
    slot = needs.setdefault(due, np.full(n_layers, -np.inf))
    slot[ls] = np.maximum(slot[ls], arrive)
  return periods * plan.period * step / (clock - start_clock)


def _fifo(ready: np.ndarray, duration: np.ndarray, free: float) -> tuple[np.ndarray, float]:
  """End times of jobs served in order by one server free from `free`: max(e_k-1, r_k) + d_k."""
  cum = np.cumsum(duration)
  before = np.r_[0.0, cum[:-1]]
  ends = cum + np.maximum(free, np.maximum.accumulate(ready - before))
  return ends, float(ends[-1])


def required_bandwidth(
    work: Workload,
    plan: SyncPlan,
    target: float,
    lo: float = 1e-6,
    hi: float = 1e9,
    iters: int = 60,
) -> float:
  """Smallest bandwidth (Gbit/s) whose steady-state utilization reaches `target` (bisection)."""
  if not 0 < target < 1:
    raise ValueError(f"target utilization must be in (0, 1), got {target!r}")
  if plan.bits_per_period() == 0:
    return 0.0  # nothing to send
  if utilization(work, plan, hi) < target:
    return float("inf")
  if utilization(work, plan, lo) >= target:
    return lo
  log_lo, log_hi = np.log(lo), np.log(hi)
  for _ in range(iters):
    mid = 0.5 * (log_lo + log_hi)
    if utilization(work, plan, float(np.exp(mid))) >= target:
      log_hi = mid
    else:
      log_lo = mid
  return float(np.exp(log_hi))
