"""Cross-datacenter bandwidth needed to reach a compute utilization, per training method.

Each method is a small object that says what one learner (datacenter) sends and when, as a
`timeline.SyncPlan`; `timeline.required_bandwidth` finds the smallest link bandwidth whose per-layer
timeline reaches the target utilization. Payload sizes come from
`diloco.outer.codecs.compression.encoded_nbytes`, so the model counts the bytes the codecs really put on the wire
(fp4 and int8 include their per-block fp32 scales).

- data_parallel: every step, every layer's gradient is all-reduced over M datacenters (ring: each
  sends and receives 2(M-1)/M of the payload), overlapped with the rest of the backward pass.
- diloco: every H steps, every layer's outer gradient is all-reduced the same way.
- streaming: P strided fragments (layer l in fragment l mod P); fragment p syncs every H steps at
  step floor(p H / P) of the period, and is needed `overlap` steps later than the next step.
- decoupled: like streaming, but each learner uploads its fragment to a central synchronizer and
  downloads the merged one (one payload each way), instead of an all-reduce among learners.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from diloco.outer.codecs import compression
from diloco.sim.timeline import required_bandwidth, SyncPlan, Workload

METHODS = ("data_parallel", "diloco", "streaming", "decoupled")
TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)


def layer_bits(work: Workload, codec: str) -> np.ndarray:
  """Wire bits of one layer's values under `codec`, for every layer."""
  return np.full(work.layers, 8.0 * compression.encoded_nbytes(codec, work.params_per_layer))


def ring_factor(learners: int) -> float:
  """Per-participant traffic of a ring all-reduce, in payloads: 2(M-1)/M."""
  return 2.0 * (learners - 1) / learners


@dataclasses.dataclass(frozen=True)
class DataParallel:
  learners: int
  codec: str = "bf16"
  name = "data_parallel"

  def __post_init__(self):
    _check(learners=(self.learners, 1))
    _check_codec(self.codec)

  def plan(self, work: Workload) -> SyncPlan:
    up = ring_factor(self.learners) * layer_bits(work, self.codec)
    return SyncPlan(
        period=1, layers_at=(tuple(range(work.layers)),), up_bits=up, down_bits=None, tau=0
    )


@dataclasses.dataclass(frozen=True)
class DiLoCo:
  learners: int
  inner_steps: int
  codec: str = "bf16"
  name = "diloco"

  def __post_init__(self):
    _check(learners=(self.learners, 1), inner_steps=(self.inner_steps, 1))
    _check_codec(self.codec)

  def plan(self, work: Workload) -> SyncPlan:
    h = self.inner_steps
    at = tuple(tuple(range(work.layers)) if s == h - 1 else () for s in range(h))
    up = ring_factor(self.learners) * layer_bits(work, self.codec)
    return SyncPlan(period=h, layers_at=at, up_bits=up, down_bits=None, tau=0)


@dataclasses.dataclass(frozen=True)
class _Fragmented:
  """A method that syncs P fragments at staggered offsets, each every H steps, overlap tau."""

  learners: int
  inner_steps: int
  fragments: int
  overlap: int
  codec: str = "fp4"

  def __post_init__(self):
    _check(
        learners=(self.learners, 1),
        inner_steps=(self.inner_steps, 1),
        fragments=(self.fragments, 1),
        overlap=(self.overlap, 0),
    )
    _check_codec(self.codec)

  def _plan(self, work: Workload, up_bits: np.ndarray, down_bits: np.ndarray | None) -> SyncPlan:
    return SyncPlan(
        period=self.inner_steps,
        layers_at=_strided(work, self.inner_steps, self.fragments),
        up_bits=up_bits,
        down_bits=down_bits,
        tau=self.overlap,
    )


@dataclasses.dataclass(frozen=True)
class StreamingDiLoCo(_Fragmented):
  name = "streaming"

  def plan(self, work: Workload) -> SyncPlan:
    return self._plan(work, ring_factor(self.learners) * layer_bits(work, self.codec), None)


@dataclasses.dataclass(frozen=True)
class DecoupledDiLoCo(_Fragmented):
  name = "decoupled"

  def plan(self, work: Workload) -> SyncPlan:
    bits = layer_bits(work, self.codec)
    return self._plan(work, bits, bits)


def _strided(work: Workload, period: int, fragments: int) -> tuple[tuple[int, ...], ...]:
  """Layers syncing at each step: fragment p = layers l with l mod P = p, at step floor(pH/P)."""
  if fragments > work.layers:
    raise ValueError(
        f"fragments ({fragments}) exceeds layers ({work.layers}): a fragment holds whole layers"
    )
  at = [[] for _ in range(period)]
  for p in range(fragments):
    at[p * period // fragments].extend(range(p, work.layers, fragments))
  return tuple(tuple(ls) for ls in at)


def make_method(
    name: str,
    *,
    learners: int,
    inner_steps: int = 100,
    fragments: int = 1,
    overlap: int = 0,
    codec: str = "fp4",
    dp_codec: str = "bf16",
    diloco_codec: str = "bf16",
):
  """The method object for a name; the only place a method is chosen by name."""
  if name == "data_parallel":
    return DataParallel(learners=learners, codec=dp_codec)
  if name == "diloco":
    return DiLoCo(learners=learners, inner_steps=inner_steps, codec=diloco_codec)
  fragmented = {"streaming": StreamingDiLoCo, "decoupled": DecoupledDiLoCo}
  if name in fragmented:
    return fragmented[name](learners, inner_steps, fragments, overlap, codec)
  raise ValueError(f"unknown method {name!r}; expected one of {METHODS}")


def needed(work: Workload, method, targets=TARGETS) -> dict[str, float]:
  """Gbit/s needed per target utilization, keyed by the target in percent ('50', '99', ...)."""
  plan = method.plan(work)
  return {f"{100 * t:g}": required_bandwidth(work, plan, t) for t in targets}


def workload_from_config(config: ml_collections.ConfigDict) -> Workload:
  return Workload(
      model_params=float(config.model_params),
      layers=config.layers,
      step_time_s=config.step_time_s,
      forward_fraction=config.forward_fraction,
  )


def methods_from_config(config: ml_collections.ConfigDict) -> list:
  names = METHODS if config.method == "all" else (config.method,)
  keys = ("learners", "inner_steps", "fragments", "overlap", "codec", "dp_codec", "diloco_codec")
  return [make_method(n, **{k: config[k] for k in keys}) for n in names]


def _check(**values: tuple[int, int]) -> None:
  for name, (value, minimum) in values.items():
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
      raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_codec(codec: str) -> None:
  if codec not in compression.CODECS:
    raise ValueError(f"unknown codec {codec!r}; expected one of {compression.CODECS}")
