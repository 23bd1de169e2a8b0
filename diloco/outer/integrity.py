"""Integrity of what travels between learners and the synchronizer.

Checksums: CRC-32 (zlib's polynomial) over a message's header numbers and its payload bytes,
computed by the sender when the message is built and verified by the receiver, so bits flipped in
transit are caught (every burst of up to 32 flipped bits, and any other corruption with probability
1 − 2^-32). zlib-ng computes it where installed (a dependency; about 25 GB/s with carry-less
multiplication, zlib about 4), zlib otherwise: the values are identical.

Screens: an outer gradient whose norm is far above what the synchronizer usually accepts for that
fragment is an outlier (a poisoned or broken learner), not progress.
"""

import dataclasses
import struct
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from diloco.outer import parallel
from diloco.outer.codecs import compression

try:
  from zlib_ng import zlib_ng as _zlib
except ImportError:  # pragma: no cover - same values, only slower
  _zlib = zlib

crc32 = _zlib.crc32
# crc32(b, crc32(a)) == crc32_combine(crc32(a), crc32(b), len(b)); zlib-ng has it, Python's zlib not.
_combine = getattr(_zlib, "crc32_combine", None)
PIECE = 1 << 22  # bytes checksummed by one task of a parallel `tree_crc`


def tree_crc(tree: Mapping[str, object]) -> int:
  """CRC-32 of a path-keyed dict of `compression.Encoded` or arrays, in sorted path order.

  With zlib-ng and several threads (`parallel.THREADS`), the payloads' pieces of `PIECE` bytes
  are checksummed on their own, at once, and joined by `crc32_combine`: the same value.
  """
  parts = []  # header bytes and payloads, in order
  for path in sorted(tree):
    x = tree[path]
    parts.append(path.encode())
    if isinstance(x, compression.Encoded):
      parts += [f"{x.codec}{x.shape}{x.block}".encode(), memoryview(x.payload).cast("B")]
    else:
      a = np.ascontiguousarray(x)
      parts += [f"{a.dtype.str}{a.shape}".encode(), memoryview(a).cast("B")]
  if parallel.THREADS == 1 or _combine is None or sum(len(p) for p in parts) < 2 * PIECE:
    crc = 0
    for p in parts:
      crc = crc32(p, crc)
    return crc
  pieces = [p[i : i + PIECE] for p in parts for i in range(0, len(p), PIECE)]
  crc = 0
  for p, c in zip(pieces, parallel.run(crc32, pieces)):
    crc = _combine(crc, c, len(p))
  return crc


def with_header(numbers: Sequence[int], payload_crc: int) -> int:
  """Extends a payload's CRC with the message's header numbers (signed 64-bit each)."""
  return crc32(struct.pack(f"<{len(numbers)}q", *numbers), payload_crc)


def norm(delta: Mapping[str, np.ndarray]) -> float:
  """Euclidean norm of a whole fragment (all its tensors), in float64."""
  return float(np.sqrt(sum(float(np.vdot(x.ravel(), x.ravel())) for x in delta.values())))


@dataclasses.dataclass(frozen=True)
class OutlierScreen:
  """Rejects outer gradients with norm > factor × the (lower) median norm of recent ones, and
  optionally clips those above clip_factor × it.

  The median is over the last `window` finite outer gradients of the fragment plus those of the
  round being merged, outliers included: an isolated poisoned upload barely moves it, and if every
  learner's norms grow (as they do while the inner learning rate warms up) the median follows
  instead of locking them out. It assumes fewer than half of them are poisoned; the lower median
  (the smaller middle value of an even count) lets a round of one honest and one poisoned upload
  reject the poisoned one. While the fragment has fewer than `min_history` such norms, the
  reference is √n × the lower median RMS (norm / √values) of recent outer gradients of any
  fragment, n the fragment's number of values. The very first upload of a run is compared with
  itself only. Zero norms (no movement, e.g. a first step at learning rate 0) set no scale and are
  left out of the medians.

  An upload carrying k inner steps, more than the `period` H a fragment's upload carries in the
  usual course (a learner back from an outage, or from a synchronizer restart, with all it
  trained meanwhile), may be k/H times the limit before it is rejected: each inner step moves a
  weight by about the learning rate, so honest progress grows at most linearly in the steps.
  Against a history of H-step norms from the warm-up, such an upload was rejected as an outlier
  and its progress lost (a learner restarted with 72 steps of one fragment against H = 8:
  norm 15.34 above the limit 15.12). The clip is not widened: it is there for exactly those
  uploads. 0: no allowance.
  """

  factor: float = 100.0
  min_history: int = 4
  window: int = 16
  # > 0: outer gradients with norm above clip_factor × the same median are scaled down to it
  # (adaptive clipping, as AutoClip clips to a percentile of recent norms). After an outage,
  # learners upload progress of many more steps than usual; the outer momentum would carry each
  # such step several times over.
  clip_factor: float = 0.0
  period: int = 0  # H: the inner steps an upload carries in the usual course (0: no allowance)

  def __post_init__(self):
    if not self.factor > 1:
      raise ValueError(f"outlier factor must be > 1, got {self.factor}")
    if not 0 <= self.clip_factor < self.factor:
      raise ValueError(
          f"clip factor must be in [0, outlier factor {self.factor}), got {self.clip_factor}"
      )
    if self.min_history < 1 or self.window < self.min_history:
      raise ValueError(f"need 1 <= min_history <= window, got {self.min_history}, {self.window}")
    if self.period < 0:
      raise ValueError(f"period must be >= 0, got {self.period}")

  def limit(
      self, norms: Sequence[float], rms: Sequence[float], size: int, round_norms: Sequence[float]
  ) -> float:
    """The largest acceptable norm for a fragment of `size` values with recent `norms`, given
    the recent RMS values of all fragments and the norms of the round being merged."""
    own = [n for n in list(norms[-self.window :]) + list(round_norms) if n > 0]
    if len(own) >= self.min_history:
      return self.factor * lower_median(own)
    scale = float(np.sqrt(size))
    rms = [r for r in list(rms[-self.window :]) + [n / scale for n in round_norms] if r > 0]
    return self.factor * scale * lower_median(rms) if rms else float("inf")

  def allowance(self, steps: int) -> float:
    """How many times the limit an upload of `steps` inner steps may reach (k/H above H)."""
    return max(1.0, steps / self.period) if self.period > 0 else 1.0

  def remember(self, history: Sequence[float], seen: Sequence[float]) -> list[float]:
    """The history after these values were seen (the last `window` kept)."""
    return (list(history) + [float(n) for n in seen])[-self.window :]


def lower_median(values: Sequence[float]) -> float:
  """The median of an odd count, the smaller of the two middle values of an even count."""
  if not values:
    raise ValueError("median of no values")
  return float(sorted(values)[(len(values) - 1) // 2])
