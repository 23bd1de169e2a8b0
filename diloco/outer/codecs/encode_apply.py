"""The downlink's encode and apply fused (`EncodeApply`): a merged fragment's outer step encoded
for the wire and its decoding added to the global values and taken from the residual, chunk by
chunk while in cache (commit.py's fast path for int8 and fp4 with log rounding)."""

from collections.abc import Callable

import numpy as np

from diloco.outer import parallel
from diloco.outer.codecs import blockwise, compression, low_bit

FUSED = ("int8", "fp4")  # codecs of `EncodeApply` (log rounding)


class EncodeApply:
  """`encode` of raw, then `add_decoded` with `check`, in one pass over chunks in cache.

  Built for one float32 tensor, run span by span (`span`, any spans of `spans()` in any order
  or on several threads), then `result()`: the same bytes and values as the two calls, since
  every operation is elementwise or within a block. A `fill(c0, c1)` passed to `span` writes
  raw[c0:c1] just before that chunk is encoded.
  """

  def __init__(
      self, raw: np.ndarray, old: np.ndarray, codec: str, block: int = compression.DEFAULT_BLOCK
  ):
    if codec not in FUSED:
      raise ValueError(f"EncodeApply takes codecs {FUSED}, got {codec!r}")
    if raw.dtype != np.float32 or old.dtype != np.float32 or raw.shape != old.shape:
      raise ValueError(f"need float32 raw and old of one shape, got {raw.dtype}, {old.dtype}")
    self.codec, self.block, self.shape = codec, block, tuple(int(d) for d in raw.shape)
    self.step = blockwise.chunk_values(block)
    self.raw_N, self.old_N = raw.reshape(-1), old.reshape(-1)
    self.new = np.empty_like(old)
    n, nb = self.raw_N.size, blockwise.num_blocks(self.raw_N.size, block)
    self.out = np.empty(compression.encoded_nbytes(codec, n, block), np.uint8)
    self.scales, self.body = (
        self.out[: compression.SCALE_BYTES * nb].view(low_bit.F32),
        self.out[compression.SCALE_BYTES * nb :],
    )

  def spans(self) -> list[tuple[int, int]]:
    return parallel.spans(self.raw_N.size, self.step)

  def span(self, start: int, stop: int, fill: Callable[[int, int], None] | None = None):
    """Values [start, stop) (start a multiple of the chunk): whether the new values and the
    residual are all finite, or None if raw holds a NaN or Inf (`encode` would raise)."""
    step, block, new_N = self.step, self.block, self.new.reshape(-1)
    tmp = np.empty(min(step, stop - start) + 1, np.float32)
    finite = True
    for c0 in range(start, stop, step):
      c1 = min(c0 + step, stop)
      if fill is not None:
        fill(c0, c1)
      if not blockwise.encode_chunk(
          self.codec, self.raw_N, c0, c1, block, tmp, self.scales, self.body
      ):
        return None
      size, b0 = c1 - c0, c0 // block
      scale_c = self.scales[b0 : b0 + blockwise.num_blocks(size, block)].astype(
          np.float32
      )  # as on the wire
      d = blockwise.decode_chunk(
          self.codec, self.body, scale_c, c0, size, block, tmp[: size + size % 2]
      )
      n, r = new_N[c0:c1], self.raw_N[c0:c1]
      np.add(self.old_N[c0:c1], d, out=n)
      np.subtract(r, d, out=r)
      if finite:
        finite = bool(np.isfinite(n).all() and np.isfinite(r).all())
    return finite

  def result(self) -> tuple[compression.Encoded, np.ndarray]:
    """The encoded tensor and old + its decoding (raw now holds raw − decoding)."""
    return compression.Encoded(self.codec, self.shape, self.out.tobytes(), self.block), self.new
