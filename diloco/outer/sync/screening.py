"""The merge-time screen of a round's outer gradients: non-finite values, outliers, clipping.

Pure: it takes what it needs (the decoded deltas, the fragment's size, the outlier screen and its
two norm histories) and says what to reject, what to scale down and which histories to keep; the
synchronizer applies the verdicts to its round (`Synchronizer._screen`).
"""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from diloco.outer import integrity
from diloco.outer.outcomes import Code

NON_FINITE = (Code.NON_FINITE, "non-finite values")


@dataclasses.dataclass(frozen=True)
class Verdicts:
  rejected: dict[int, tuple[Code, str]]  # delta index -> (code, reason)
  scale: dict[int, float]  # delta index -> the factor its delta is clipped by
  norms: list[float]  # the fragment's norm history after this round
  rms: list[float]  # the norm/sqrt(size) history, any fragment, after this round


def screen_round(
    deltas: Sequence[Mapping[str, np.ndarray]],
    size: int,
    screen: integrity.OutlierScreen,
    norms: list[float],
    rms: list[float],
    steps: Sequence[int] = (),
) -> Verdicts:
  """Rejects non-finite deltas (NaN or Inf values, or an overflow of the norm) and those whose
  norm is above the screen's limit (times its allowance for the inner `steps` each carries);
  scales the others above the clipping norm down to it. Outliers enter the histories too, so a
  general shift of the norms is followed."""
  rejected: dict[int, tuple[Code, str]] = {}
  scale: dict[int, float] = {}
  found = {i: integrity.norm(d) for i, d in enumerate(deltas)}
  for i, n in list(found.items()):
    if not np.isfinite(n) and not all(np.isfinite(x).all() for x in deltas[i].values()):
      rejected[i] = NON_FINITE
      del found[i]
  limit = screen.limit(norms, rms, size, list(found.values())) if found else 0.0
  clip = limit / screen.factor * screen.clip_factor
  for i, n in found.items():
    allowed = limit * screen.allowance(steps[i] if steps else 0)
    if not n <= allowed:
      rejected[i] = (Code.OUTLIER, f"outlier: norm {n:.4g} above the limit {allowed:.4g}")
    elif 0 < clip < n:
      scale[i] = clip / n
  seen = list(found.values())
  return Verdicts(
      rejected,
      scale,
      screen.remember(norms, seen),
      screen.remember(rms, [n / np.sqrt(size) for n in seen]),
  )


def screened(
    deltas: list[Mapping[str, np.ndarray]],
    values: Mapping[str, np.ndarray],
    screen: integrity.OutlierScreen,
    norms: list[float],
    rms: list[float],
    steps: Sequence[int] = (),
) -> tuple[list[Mapping[str, np.ndarray]], dict[int, tuple[Code, str]], set[int], list, list]:
  """`screen_round` over a fragment of `values`' size applied: (the deltas, clipped ones scaled
  down; the rejected; the indices clipped; the two norm histories after the round)."""
  v = screen_round(deltas, sum(x.size for x in values.values()), screen, norms, rms, steps)
  deltas = list(deltas)
  for i, factor in v.scale.items():
    d = deltas[i]
    scaled = getattr(d, "scaled", None)  # compression.Decoded: scaled as each leaf is read
    deltas[i] = scaled(factor) if scaled else {k: x * np.float32(factor) for k, x in d.items()}
  return deltas, v.rejected, set(v.scale), v.norms, v.rms
