"""Synchronizer policies: who must report before a merge, how long to wait, how to weigh.

A mode is a choice of these objects, made once (see `from_config`):
  synchronous DiLoCo / Streaming DiLoCo: AllLearners, NoGrace, equal weights, mean;
  Decoupled DiLoCo: MinQuorum(K), AdaptiveGrace(γ, τ), token weights, RDA.
"""

import dataclasses
from typing import Protocol

import ml_collections
import numpy as np

from diloco.outer import merging


class Quorum(Protocol):
    def required(self, live: int) -> int:
        """How many uploads of a fragment must be in before its merge can start."""


@dataclasses.dataclass(frozen=True)
class AllLearners:
    """Synchronous: every live learner."""

    def required(self, live: int) -> int:
        return max(live, 1)


@dataclasses.dataclass(frozen=True)
class MinQuorum:
    """Decoupled: at least K learners (fewer if fewer are alive, but at least one)."""

    k: int = 1

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"quorum must be >= 1, got {self.k}")

    def required(self, live: int) -> int:
        return max(1, min(self.k, live))


@dataclasses.dataclass
class Ema:
    """Exponential moving average; the first sample initialises it."""

    decay: float
    value: float | None = None

    def update(self, sample: float) -> float:
        self.value = sample if self.value is None else self.decay * self.value + (1 - self.decay) * sample
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


def equal_weights(tokens: list[int], steps: list[int]) -> np.ndarray:
    del steps
    return merging.equal_weights(len(tokens))


def token_weights(tokens: list[int], steps: list[int]) -> np.ndarray:
    return merging.token_weights(tokens, steps)


WEIGHTINGS = {"equal": equal_weights, "tokens": token_weights}


@dataclasses.dataclass(frozen=True)
class Policy:
    """Everything the synchronizer decides by."""

    quorum: Quorum
    grace: Grace
    weighting: str  # 'equal' | 'tokens'
    merge: str  # 'mean' | 'rda'
    ema_decay: float = 0.9
    max_staleness: int = 1 << 30  # contributions further behind are dropped
    # Scale a merge by the weighted mean of 1/(1+staleness) of its uploads (staleness-aware
    # asynchronous SGD): uploads from one base that merge one by one are not simply summed.
    staleness_damping: bool = False

    def __post_init__(self):
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {self.weighting!r}; expected {sorted(WEIGHTINGS)}")
        if self.merge not in merging.RULES:
            raise ValueError(f"unknown merge {self.merge!r}; expected one of {merging.RULES}")

    def weights(self, tokens: list[int], steps: list[int]) -> np.ndarray:
        return WEIGHTINGS[self.weighting](tokens, steps)


SYNCHRONOUS = Policy(AllLearners(), NoGrace(), weighting="equal", merge="mean")


def from_config(config: ml_collections.ConfigDict) -> Policy:
    """The synchronizer policy of a run's `outer` config section."""
    o = config.outer
    if o.quorum == 0:  # 0 = all live learners: synchronous (Streaming) DiLoCo
        quorum = AllLearners()
    else:
        quorum = MinQuorum(o.quorum)
    grace = AdaptiveGrace(o.grace_gamma, config.outer.overlap) if o.grace_gamma > 0 else NoGrace()
    return Policy(quorum, grace, weighting=o.weighting, merge=o.merge, ema_decay=o.ema_decay,
                  max_staleness=o.max_staleness, staleness_damping=o.staleness_damping)
