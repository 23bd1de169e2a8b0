"""Integrity of what travels between learners and the synchronizer.

Checksums: CRC-32 (zlib) over a message's header numbers and its payload bytes, computed by the
sender when the message is built and verified by the receiver, so bits flipped in transit are
caught (every burst of up to 32 flipped bits, and any other corruption with probability
1 − 2^-32). Screens: an outer gradient whose norm is far above what the synchronizer usually
accepts for that fragment is an outlier (a poisoned or broken learner), not progress.
"""

import dataclasses
import struct
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from diloco import compression


def tree_crc(tree: Mapping[str, object]) -> int:
    """CRC-32 of a path-keyed dict of `compression.Encoded` or arrays, in sorted path order."""
    crc = 0
    for path in sorted(tree):
        x = tree[path]
        crc = zlib.crc32(path.encode(), crc)
        if isinstance(x, compression.Encoded):
            crc = zlib.crc32(f"{x.codec}{x.shape}{x.block}".encode(), crc)
            crc = zlib.crc32(x.payload, crc)
        else:
            a = np.ascontiguousarray(x)
            crc = zlib.crc32(f"{a.dtype.str}{a.shape}".encode(), crc)
            crc = zlib.crc32(memoryview(a).cast("B"), crc)
    return crc


def with_header(numbers: Sequence[int], payload_crc: int) -> int:
    """Extends a payload's CRC with the message's header numbers (signed 64-bit each)."""
    return zlib.crc32(struct.pack(f"<{len(numbers)}q", *numbers), payload_crc)


def norm(delta: Mapping[str, np.ndarray]) -> float:
    """Euclidean norm of a whole fragment (all its tensors), in float64."""
    return float(np.sqrt(sum(float(np.vdot(x.ravel(), x.ravel())) for x in delta.values())))


@dataclasses.dataclass(frozen=True)
class OutlierScreen:
    """Rejects outer gradients with norm > factor × the median norm of recent ones.

    The median is over the last `window` finite outer gradients of the fragment, outliers included:
    an isolated poisoned upload barely moves it, and if every learner's norms grow (as they do
    while the inner learning rate warms up) the median follows instead of locking them out. It
    assumes fewer than half of a fragment's recent uploads are poisoned. Until the fragment has
    `min_history` of them, the reference is √n × the median RMS (norm / √values) of recent outer
    gradients of any fragment, n the fragment's number of values; before that (the first merges of
    a run), no check.
    """

    factor: float = 100.0
    min_history: int = 4
    window: int = 16

    def __post_init__(self):
        if not self.factor > 1:
            raise ValueError(f"outlier factor must be > 1, got {self.factor}")
        if self.min_history < 1 or self.window < self.min_history:
            raise ValueError(f"need 1 <= min_history <= window, got {self.min_history}, "
                             f"{self.window}")

    def limit(self, norms: Sequence[float], rms: Sequence[float], size: int) -> float:
        """The largest acceptable norm for a fragment of `size` values with recent `norms`, given
        the recent RMS values of all fragments (inf: no check yet)."""
        if len(norms) >= self.min_history:
            return self.factor * float(np.median(norms[-self.window:]))
        if len(rms) >= self.min_history:
            return self.factor * float(np.median(rms[-self.window:])) * float(np.sqrt(size))
        return float("inf")

    def remember(self, history: Sequence[float], seen: Sequence[float]) -> list[float]:
        """The history after these values were seen (the last `window` kept)."""
        return (list(history) + [float(n) for n in seen])[-self.window:]
