"""Messages between learners, runtimes and the synchronizer: events in, actions out.

Fragments travel as path-keyed dicts ('blocks/3/attn/qkv' -> array). Learners upload their outer
gradient Δ = Θ_base − θ_local, encoded by a codec; the synchronizer sends back either the encoded
update that turns the learner's version v−1 into v, or the full fp32 fragment when the learner holds
an older version.
"""

import dataclasses
from collections.abc import Mapping

import numpy as np

from diloco import compression

Flat = Mapping[str, np.ndarray]
EncodedFlat = Mapping[str, compression.Encoded]


# ---- events: what happened (the synchronizer consumes these) ----


@dataclasses.dataclass(frozen=True)
class Join:
    """Learner joins (or rejoins) holding these fragment versions."""

    learner: int
    time: float
    versions: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Leave:
    learner: int
    time: float


@dataclasses.dataclass(frozen=True)
class Upload:
    """Learner's outer gradient of one fragment, with its progress since it last received it."""

    learner: int
    fragment: int
    base_version: int
    delta: EncodedFlat
    steps: int
    tokens: int
    time: float  # arrival at the synchronizer
    sent_time: float  # departure from the learner
    step_time: float  # the learner's recent seconds per inner step

    @property
    def nbytes(self) -> int:
        return compression.tree_nbytes(self.delta)


@dataclasses.dataclass(frozen=True)
class Tick:
    """A timer the synchronizer asked for has expired."""

    time: float


Event = Join | Leave | Upload | Tick


# ---- actions: what the synchronizer wants done (runtimes carry them out) ----


@dataclasses.dataclass(frozen=True)
class Send:
    """Deliver fragment `fragment` at `version` to one learner: an update or the full values."""

    learner: int
    fragment: int
    version: int
    update: EncodedFlat | None = None  # apply to version - 1
    values: Flat | None = None  # full fp32 fragment

    @property
    def nbytes(self) -> int:
        if self.update is not None:
            return compression.tree_nbytes(self.update)
        return int(sum(np.asarray(v).nbytes for v in self.values.values()))


@dataclasses.dataclass(frozen=True)
class SetTimer:
    time: float


@dataclasses.dataclass(frozen=True)
class Log:
    record: dict


Action = Send | SetTimer | Log
