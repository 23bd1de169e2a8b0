"""Synchronizer policies: who must report before a merge, how long to wait, how to weigh, how to merge.

A mode is a choice of these objects, made once (see `from_config`):
  synchronous DiLoCo / Streaming DiLoCo: AllMembers (AllLive when elastic), NoGrace, EqualWeights,
  Mean; Decoupled DiLoCo: MinQuorum(K), AdaptiveGrace(γ, τ), TokenWeights, RDA.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import ml_collections
import numpy as np

from diloco.outer import merging
from diloco.outer.codecs import compression
from diloco.outer.protocol import Upload


class Quorum(Protocol):
  """Who a round of merges counts, and how many of them must have uploaded."""

  # True: every learner that ever joined counts, crashed ones included, and a round in
  # progress waits for a learner that (re)joins in its middle; False: only live learners.
  of_members: bool

  def required(self, counted: int) -> int:
    """How many uploads of a fragment from `counted` learners must be in before its merge."""


@dataclasses.dataclass(frozen=True)
class AllMembers:
  """Synchronous without elasticity: every member; merges wait for crashed ones to return."""

  of_members = True

  def required(self, counted: int) -> int:
    return max(counted, 1)


@dataclasses.dataclass(frozen=True)
class AllLive:
  """Synchronous and elastic: every live learner."""

  of_members = False

  def required(self, counted: int) -> int:
    return max(counted, 1)


@dataclasses.dataclass(frozen=True)
class MinQuorum:
  """Decoupled: at least K live learners (fewer if fewer are alive, but at least one)."""

  k: int = 1
  of_members = False

  def __post_init__(self):
    if self.k < 1:
      raise ValueError(f"quorum must be >= 1, got {self.k}")

  def required(self, counted: int) -> int:
    return max(1, min(self.k, counted))


@dataclasses.dataclass
class Ema:
  """Exponential moving average; the first sample initialises it."""

  decay: float
  value: float | None = None

  def update(self, sample: float) -> float:
    self.value = (
        sample if self.value is None else self.decay * self.value + (1 - self.decay) * sample
    )
    return self.value

  def get(self) -> float:
    return 0.0 if self.value is None else self.value


class Grace(Protocol):

  def window(self, step_s: float, quorum_s: float, sync_s: float) -> float:
    """Seconds to wait for more learners once the quorum is reached."""


@dataclasses.dataclass(frozen=True)
class NoGrace:

  def window(self, step_s: float, quorum_s: float, sync_s: float) -> float:
    return 0.0


@dataclasses.dataclass(frozen=True)
class AdaptiveGrace:
  """grace = max(0, γ·(τ·ξ_step − ξ_quorum − ξ_sync)): the overlap budget left after the sync."""

  gamma: float = 0.8
  overlap: int = 2

  def __post_init__(self):
    if not 0 <= self.gamma <= 1:
      raise ValueError(f"grace_gamma must be in [0, 1], got {self.gamma}")
    if self.overlap < 0:
      raise ValueError(f"overlap must be >= 0, got {self.overlap}")

  def window(self, step_s: float, quorum_s: float, sync_s: float) -> float:
    return max(0.0, self.gamma * (self.overlap * step_s - quorum_s - sync_s))


class Weighting(Protocol):

  def __call__(self, tokens: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    """Each upload's merge weight, from its tokens and steps since its base version."""


@dataclasses.dataclass(frozen=True)
class EqualWeights:

  def __call__(self, tokens: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    del steps
    return merging.equal_weights(len(tokens))


@dataclasses.dataclass(frozen=True)
class TokenWeights:
  """w = tokens · tokens/steps: quantity times quality (Decoupled DiLoCo)."""

  def __call__(self, tokens: Sequence[int], steps: Sequence[int]) -> np.ndarray:
    return merging.token_weights(tokens, steps)


Deltas = Sequence[Mapping[str, np.ndarray]]


class Merge(Protocol):

  def __call__(
      self, deltas: Deltas, weights: Sequence[float]
  ) -> tuple[dict[str, np.ndarray], list[int]]:
    """The merged outer gradient, and the indices of deltas holding NaN or Inf."""


@dataclasses.dataclass(frozen=True)
class Mean:
  """The weighted mean of the outer gradients."""

  def __call__(self, deltas: Deltas, weights: Sequence[float]):
    return merging.merge_checked(deltas, weights, rule="mean")


@dataclasses.dataclass(frozen=True)
class RDA:
  """Radial-directional averaging per tensor; embeddings by the weighted mean."""

  def __call__(self, deltas: Deltas, weights: Sequence[float]):
    return merging.merge_checked(deltas, weights, rule="rda")


WEIGHTINGS: dict[str, Weighting] = {"equal": EqualWeights(), "tokens": TokenWeights()}
MERGES: dict[str, Merge] = {"mean": Mean(), "rda": RDA()}


@dataclasses.dataclass(frozen=True)
class Policy:
  """Everything the synchronizer decides by."""

  quorum: Quorum
  grace: Grace
  weights: Weighting
  merge: Merge
  ema_decay: float = 0.9
  max_staleness: int = 1 << 30  # contributions further behind are dropped
  # Scale a merge by the weighted mean of 1/(1+staleness) of its uploads (staleness-aware
  # asynchronous SGD): uploads from one base that merge one by one are not simply summed.
  staleness_damping: bool = False
  # Who is sent a merged fragment: "all" live learners (DiLoCo, Decoupled DiLoCo), or only the
  # "contributors" to that merge (asynchronous Local-SGD: a worker pulls the global model after
  # it pushes; the others keep training on what they hold and upload against it later).
  broadcast: str = "all"
  # > 0 (with broadcast "contributors"): a merge's contributors are not answered at once; they
  # wait until this long after the first of them (or until every live learner waits), then all
  # restart together from the newest version (the restart window of Async Local-SGD's toy).
  restart_window_s: float = 0.0
  # Sends carry the inner steps merged so far (`Send.progress`): outer.schedule_by=global.
  send_progress: bool = False
  dylu_inner_steps: int = 0  # >0: DyLU on, with the fastest learner's H (Dylu below)
  # What an outer gradient is taken against: "base", the version the learner started from
  # (Δ = Θ_base − θ, formed by the learner), or "global", the synchronizer's fragment when the
  # upload arrives (the learner sends θ; Δ = Θ − θ, not stale).
  anchor: str = "base"
  # When a fragment merges, and the share of an outer step a merge takes (merge_clock.py):
  # "arrival" | "period" (once per H steps of the reference pace), "one" | "tokens".
  merge_clock: str = "arrival"
  merge_scale: str = "one"
  clock_steps: int = 1  # H, the period's inner steps

  def __post_init__(self):
    if self.broadcast not in BROADCASTS:
      raise ValueError(f"unknown outer.broadcast {self.broadcast!r}; expected one of {BROADCASTS}")
    if self.anchor not in ANCHORS:
      raise ValueError(f"unknown outer.anchor {self.anchor!r}; expected one of {ANCHORS}")


BROADCASTS = ("all", "contributors")
ANCHORS = ("base", "global")


def anchored(up: Upload, values: Mapping[str, np.ndarray]) -> Upload:
  """anchor=global: the upload carries θ_m; its outer gradient is Θ_p − θ_m against the
  fragment's `values` as they are now (the version its round merges into), kept in fp32."""
  theta = compression.decode_tree(up.delta)
  delta = {k: np.asarray(values[k], np.float32) - theta[k] for k in values}
  return dataclasses.replace(up, delta=compression.encode_tree(delta, "fp32"), checksum=None)


SYNCHRONOUS = Policy(AllLive(), NoGrace(), EqualWeights(), Mean())


def _pick(table: dict, name: str, what: str):
  if name not in table:
    raise ValueError(f"unknown {what} {name!r}; expected one of {sorted(table)}")
  return table[name]


def quorum_of(o: ml_collections.ConfigDict) -> Quorum:
  """outer.quorum K > 0: MinQuorum(K); 0: all members, or all live learners when elastic."""
  if o.quorum < 0:
    raise ValueError(f"outer.quorum must be >= 0, got {o.quorum}")
  if o.quorum == 0:
    return AllLive() if o.elastic else AllMembers()
  return MinQuorum(o.quorum)


def from_config(config: ml_collections.ConfigDict) -> Policy:
  """The synchronizer policy of a run's `outer` config section."""
  o = config.outer
  grace = AdaptiveGrace(o.grace_gamma, o.overlap) if o.grace_gamma > 0 else NoGrace()
  return Policy(
      quorum_of(o),
      grace,
      weights=_pick(WEIGHTINGS, o.weighting, "outer.weighting"),
      merge=_pick(MERGES, o.merge, "outer.merge"),
      ema_decay=o.ema_decay,
      max_staleness=o.max_staleness,
      staleness_damping=o.staleness_damping,
      broadcast=o.broadcast,
      restart_window_s=o.get("restart_window_s", 0.0),
      send_progress=o.get("schedule_by", "own") == "global",
      dylu_inner_steps=o.inner_steps if o.dylu else 0,
      anchor=o.get("anchor", "base"),
      merge_clock=o.get("merge_clock", "arrival"),
      merge_scale=o.get("merge_scale", "one"),
      clock_steps=o.inner_steps,
  )


class Dylu:
  """Dynamic local updates (DyLU, Liu et al. 2024, arXiv 2401.09135, eq. 6), measured: per-learner
  step-time averages and the inner steps they give.

  Learner m's inner steps between two syncs of a fragment are H_m = max(1, ⌊v_m / v_max · H⌋), v the
  speed in steps per second: the fastest learner keeps H and a learner half as fast syncs every H/2
  steps, so that rounds take about the same time everywhere and a slow learner's outer gradients are
  neither stale nor few. Speeds are measured, not configured: the synchronizer keeps an exponential
  moving average of the step time each learner reports with its uploads, and sends H_m along with
  every fragment it sends that learner (protocol.Send.inner_steps); a learner not yet measured keeps
  its schedule.
  """

  def __init__(self, inner_steps: int, decay: float):
    if inner_steps < 1:
      raise ValueError(f"DyLU needs inner_steps >= 1, got {inner_steps}")
    self.inner_steps, self.decay = inner_steps, decay
    self.step_s: dict[int, Ema] = {}

  def observe(self, learner: int, step_time: float) -> None:
    if step_time > 0 and math.isfinite(step_time):
      self.step_s.setdefault(learner, Ema(self.decay)).update(step_time)

  def steps_for(self, learner: int, live: set[int]) -> int:
    """H_m for `learner` against the fastest live learner measured; 0 if it is not measured."""
    if learner not in self.step_s:
      return 0
    fastest = min(self.step_s[m].get() for m in live | {learner} if m in self.step_s)
    return max(1, math.floor(self.inner_steps * fastest / self.step_s[learner].get() + 1e-9))
