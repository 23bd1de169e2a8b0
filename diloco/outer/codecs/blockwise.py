"""The block-scaled codecs' arithmetic (int8, and fp4 with log rounding), chunk by chunk: a
chunk of values to its blocks' scales and codes, and back (compression.py owns the wire format;
its module doc, the codecs' definitions and error bounds). A chunk is a whole, even number of
blocks (`chunk_values`), so that its temporaries stay in cache and its scales and bytes split
evenly.
"""

import math

import numpy as np

from diloco.outer.codecs import low_bit

# int8 and fp4 work through an array in chunks of this many values (a multiple of any block up to
# it), so that their temporaries stay in cache.
CHUNK = 1 << 17
TINY = low_bit.TINY  # blocks whose max|x| is below it decode as zeros


def num_blocks(num_values: int, block: int) -> int:
  return -(-num_values // block)


def chunk_values(block: int) -> int:
  """Values per chunk: an even number of whole blocks' values, about CHUNK."""
  step = max(CHUNK // block, 1) * block
  return step * (1 + step % 2)


def blocks(x_N: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray | None]:
  """Splits into a (nb, block) view of the whole blocks and the short tail (or None)."""
  whole = (x_N.size // block) * block
  tail = x_N[whole:] if whole < x_N.size else None
  return x_N[:whole].reshape(-1, block), tail


def block_amax(x_N: np.ndarray, block: int, scratch: np.ndarray | None = None) -> np.ndarray:
  """max|x| of every block (the last may be short), float32 [num_blocks]; |x| goes to
  ``scratch`` (float32, x's size) when given."""
  a_N = np.abs(x_N, out=scratch)
  a_BxK, tail = blocks(a_N, block)
  amax = np.empty(num_blocks(x_N.size, block), np.float32)
  if a_BxK.size:
    a_BxK.max(axis=1, out=amax[: a_BxK.shape[0]])
  if tail is not None:
    amax[-1] = tail.max()
  return amax


def scaled(
    op: np.ufunc, src_N: np.ndarray, scale: np.ndarray, block: int, out_N: np.ndarray
) -> None:
  """``out = op(src, scale of the value's block)`` over the whole blocks and the short tail."""
  s_BxK, s_tail = blocks(src_N, block)
  o_BxK, o_tail = blocks(out_N, block)
  nb = s_BxK.shape[0]
  if nb:
    op(s_BxK, scale[:nb, None], out=o_BxK)
  if s_tail is not None:
    op(s_tail, scale[-1], out=o_tail)


def usable_scale(amax: np.ndarray) -> np.ndarray:
  """amax with blocks below ``TINY`` flushed to zero (their values decode as 0)."""
  return np.where(amax >= TINY, amax, np.float32(0))


def int8_codes(
    x_N: np.ndarray, amax: np.ndarray, block: int, tmp: np.ndarray, out: np.ndarray
) -> None:
  """Writes round(x/s) with s = amax/127 into ``out`` int8 [n] (``tmp``: float32 [n] scratch)."""
  inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
  scaled(np.multiply, x_N, inv, block, tmp)
  np.rint(tmp, out=tmp)  # |x·127/amax| <= 127 up to an ulp, so no clip is needed
  out[:] = tmp


def fp4_pack(x_N: np.ndarray, amax: np.ndarray, block: int, y: np.ndarray, out: np.ndarray) -> None:
  """Writes log-rounded nibbles, two per byte, into ``out`` uint8 [(n + 1) // 2] (``y``: float32
  [n] scratch): y = x·(√2/s), then low_bit.fp4_log_nibbles."""
  inv = np.divide(np.float32(math.sqrt(2)), amax, out=np.zeros_like(amax), where=amax > 0)
  scaled(np.multiply, x_N, inv, block, y)  # |y| in [0, √2]
  low_bit.fp4_log_nibbles(y, out)


def encode_chunk(
    codec: str,
    x_N: np.ndarray,
    c0: int,
    c1: int,
    block: int,
    tmp: np.ndarray,
    scales: np.ndarray,
    body: np.ndarray,
) -> bool:
  """Encodes x[c0:c1] (int8 or log-rounded fp4; c0 a multiple of 2·block) into its blocks'
  `scales` and its bytes of `body`; False, with nothing written, if a value is NaN or Inf."""
  x_c, b0 = x_N[c0:c1], c0 // block
  amax = block_amax(x_c, block, tmp[: x_c.size])
  if amax.size and not np.isfinite(amax).all():
    return False
  amax = usable_scale(amax)
  scales[b0 : b0 + amax.size] = amax / np.float32(127) if codec == "int8" else amax
  if codec == "int8":
    int8_codes(x_c, amax, block, tmp[: x_c.size], body[c0:c1].view(np.int8))
  else:
    fp4_pack(x_c, amax, block, tmp[: x_c.size], body[c0 // 2 : (c1 + 1) // 2])
  return True


def decode_chunk(
    codec: str,
    body: np.ndarray,
    scale_c: np.ndarray,
    c0: int,
    size: int,
    block: int,
    room: np.ndarray,
) -> np.ndarray:
  """Values c0..c0+size of an int8 or fp4 payload (`body` its bytes, `scale_c` float32 of their
  blocks) decoded into `room` (float32, size + size % 2); its first `size` values."""
  x_c = room[:size]
  if codec == "int8":
    x_c[:] = body[c0 : c0 + size].view(np.int8)
  else:  # one gather of 8 bytes (two float32 values) per payload byte
    pairs = room.view(np.uint64)
    # A byte indexes FP4_PAIRS' 256 entries: "clip" never clips, and unlike "raise" it writes to
    # `out` directly (no temporary the size of the chunk, freshly mapped on every call).
    np.take(low_bit.FP4_PAIRS, body[c0 // 2 : c0 // 2 + pairs.size], out=pairs, mode="clip")
  scaled(np.multiply, x_c, scale_c, block, x_c)
  return x_c
