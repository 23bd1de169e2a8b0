"""A learner's uplink encoder: its outer gradients on the wire, with optional error feedback.

Without error feedback an upload of fragment p carries encode(Δ_p), Δ_p = Θ_base − θ_local. With
it, the learner keeps what the codec lost, e_p, and sends encode(Δ_p + e_p), keeping
e_p ← Δ_p + e_p − decode(sent): the part of its progress the codec dropped goes out with the next
upload instead of being lost when the merged fragment overwrites the local one (α = 0). An upload
that is lost or refused keeps its residual, so that part of it is counted again next time (an
error of the codec's size, not of the update's).

Stochastic fp4 rounding draws from a generator seeded by (seed, learner): reproducible runs.
"""

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from diloco.outer.codecs import compression


@dataclasses.dataclass
class Uplink:
  codec: str = "fp32"
  rounding: str = "log"  # fp4: log | linear | stochastic
  error_feedback: bool = False
  seed: tuple[int, ...] = (0,)
  residuals: dict[int, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.codec not in compression.CODECS:
      raise ValueError(f"unknown codec {self.codec!r}; expected one of {compression.CODECS}")
    if self.rounding not in compression.ROUNDINGS:
      raise ValueError(
          f"unknown fp4 rounding {self.rounding!r}; expected one of {compression.ROUNDINGS}"
      )
    self.rng = np.random.default_rng(list(self.seed))

  def encode(
      self,
      p: int,
      global_copy: Mapping[str, np.ndarray],
      local: Mapping[str, np.ndarray],
      whole: Callable[[dict], Mapping[str, np.ndarray]] | None = None,
      cut: Callable[[dict], Mapping[str, np.ndarray]] | None = None,
  ) -> dict[str, compression.Encoded]:
    """The wire form of fragment p's outer gradient (and its new residual, with feedback).

    A multi-process learner passes its own parts of the arrays (rpc/host_parts.py) with `whole`,
    which gathers them (the wire form is encoded whole), and `cut`, which takes a process's part
    of whole arrays back (its residual is kept as a part)."""
    delta = {
        k: np.asarray(global_copy[k], np.float32) - np.asarray(local[k], np.float32)
        for k in global_copy
    }
    if self.error_feedback and p in self.residuals:
      delta = {k: v + self.residuals[p][k] for k, v in delta.items()}
    sent = compression.encode_tree(
        delta if whole is None else whole(delta),
        self.codec,
        rounding=self.rounding,
        rng=self.rng,
    )
    if self.error_feedback:
      decoded = compression.decode_tree(sent)
      decoded = decoded if cut is None else cut(decoded)
      self.residuals[p] = {k: v - decoded[k] for k, v in delta.items()}
    return sent

  def residual_of(self, p: int, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Fragment p's residual (zeros before its first upload), for a checkpoint."""
    held = self.residuals.get(p, {})
    return {k: held.get(k, np.zeros(s, np.float32)) for k, s in shapes.items()}
