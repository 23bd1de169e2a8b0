"""A learner: one island's train state plus what it knows of the global fragments.

Per fragment p it keeps its copy of the last global version it received (Θ_p, on the host), that
version number, and counters of inner steps and tokens since it received p. Uploads carry the
encoded outer gradient Θ_p − θ_p; a received fragment is mixed in as θ_p ← α·θ_p + (1−α)·Θ_p and
resets p's counters.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from diloco import fragments, island as island_lib, synchronizer
from diloco import step as step_lib
from diloco.protocol import Send, Upload


@dataclasses.dataclass
class Learner:
    index: int
    island: island_lib.Island
    frag: fragments.Fragmentation
    schedule: fragments.Schedule
    codec: str
    alpha: float
    tokens_per_step: int
    state: Any = None
    global_copy: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    c_steps: list[int] = dataclasses.field(default_factory=list)
    c_tokens: list[int] = dataclasses.field(default_factory=list)
    steps: int = 0
    tokens: int = 0

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        n = self.frag.num_fragments
        self.versions, self.c_steps, self.c_tokens = [0] * n, [0] * n, [0] * n
        if self.state is None:
            self.state = self.island.init_state()

    def host_params(self) -> dict[str, np.ndarray]:
        """All parameters as a path-keyed dict of host arrays."""
        return {k: np.asarray(v) for k, v in fragments.flatten(jax.device_get(self.state.params)).items()}

    def load_global(self, flat: Mapping[str, np.ndarray], versions: list[int]) -> None:
        """Starts from these global parameters (at these versions) with counters at zero."""
        self.global_copy = [{k: np.array(flat[k], np.float32) for k in self.frag.paths[p]}
                            for p in range(self.frag.num_fragments)]
        self.versions = list(versions)
        self._write({k: v for g in self.global_copy for k, v in g.items()})
        self.c_steps = [0] * self.frag.num_fragments
        self.c_tokens = [0] * self.frag.num_fragments

    def step(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """One inner step (dispatched asynchronously); returns its metrics on device."""
        self.state, metrics = self.island.fns.train(
            self.state, step_lib.put_batch(batch, self.island.fns.mesh))
        self.steps += 1
        self.tokens += self.tokens_per_step
        for p in range(self.frag.num_fragments):
            self.c_steps[p] += 1
            self.c_tokens[p] += self.tokens_per_step
        return metrics

    def due(self) -> list[int]:
        """Fragments whose schedule says to sync after the step just taken, if they progressed.

        A fragment received during the step has no progress left to send (its counters are 0).
        """
        return [p for p in self.schedule.syncs_at(self.steps) if self.c_steps[p] > 0]

    def upload(self, p: int, sent_time: float, arrival_time: float, step_time: float) -> Upload:
        """The outer gradient of fragment p against the last global version received."""
        local = self._read(p)
        return Upload(
            learner=self.index, fragment=p, base_version=self.versions[p],
            delta=synchronizer.outer_gradient(self.global_copy[p], local, self.codec),
            steps=self.c_steps[p], tokens=self.c_tokens[p], time=arrival_time,
            sent_time=sent_time, step_time=step_time)

    def receive(self, send: Send) -> None:
        """Takes a new global version of a fragment and mixes it into the local parameters."""
        p = send.fragment
        if send.update is not None and send.version != self.versions[p] + 1:
            raise ValueError(f"learner {self.index} holds version {self.versions[p]} of fragment {p}"
                             f" but got an update to version {send.version}")
        new = synchronizer.apply_send(self.global_copy[p], send)
        self.global_copy[p], self.versions[p] = new, send.version
        if self.alpha > 0:
            local = self._read(p)
            new = {k: self.alpha * local[k] + (1 - self.alpha) * new[k] for k in new}
        self._write(new)
        self.c_steps[p] = self.c_tokens[p] = 0

    def _read(self, p: int) -> dict[str, np.ndarray]:
        flat = fragments.flatten(self.state.params)
        return {k: np.asarray(jax.device_get(flat[k])) for k in self.frag.paths[p]}

    def _write(self, values: Mapping[str, np.ndarray]) -> None:
        flat = dict(fragments.flatten(self.state.params))
        for k, v in values.items():
            flat[k] = jax.device_put(np.asarray(v, flat[k].dtype), flat[k].sharding)
        params = fragments.unflatten(flat, like=self.state.params)
        self.state = self.state._replace(params=params)
