"""Codes below 4 bits a value, and fp4 roundings other than log-nearest (see compression.py).

x is the input cast to float32 and s the scale of its block (the payload holds s as float32):

- ``2bit``: s = max|x|; four symmetric levels {-s, -s/3, +s/3, +s}, each value rounded to the
  nearest (|x| < 2s/3 -> s/3, else s; the sign of +0 is +). Code = sign << 1 | (|x| >= 2s/3), four
  values per byte, value 4i+j in bits 2j..2j+1; |x̂ - x| <= s/3.
- ``1bit``: s = mean|x| of the block; x̂ = s·sign(x) (+s for x >= 0). Eight values per byte, value
  8i+j in bit j (set: negative); |x̂ - x| = ||x| - s|.
- fp4 roundings of r = |x|/s between the magnitudes lo < hi that bracket it ({0, 2^-6, ..., 1}):
  ``log`` (compression.py) goes to the nearer in log2; ``linear`` to the nearer on the line (ties
  up), so |x̂ - x| <= max(|x|/3, s·2^-7); ``stochastic`` goes up with probability (r - lo)/(hi - lo),
  so that E[x̂] = x (unbiased), |x̂ - x| <= max(|x|, s·2^-6).

Blocks whose max|x| is below 2^-100 decode as zeros, as in compression.py.
"""

import sys

import numpy as np

ROUNDINGS = ("log", "linear", "stochastic")
# Blocks whose max|x| is below this decode as zeros (compression.py's int8 and fp4 too).
TINY = np.float32(2.0**-100)
F32 = np.dtype("<f4")
# 2-bit code -> value in units of s.
_LEVELS2 = np.array([1 / 3, 1.0, -1 / 3, -1.0], np.float32)
_SHIFTS2 = np.array([0, 2, 4, 6], np.uint8)
# Nibble -> signed magnitude in units of the block scale (code 0 is zero whatever the sign bit).
_FP4_MAGNITUDES = [0.0] + [2.0 ** (k - 7) for k in range(1, 8)]
_FP4_LUT = np.array(_FP4_MAGNITUDES + [-m for m in _FP4_MAGNITUDES], dtype=np.float32)
# Top 16 bits of the float32 √2·x/s -> nibble: sign << 3 | clip(biased exponent - 120, 0, 7), uint8
# [65536]. A biased exponent of at most 120 means |x| < s·2^-6.5: code 0 (zero).
_TOP16 = np.arange(1 << 16, dtype=np.uint32)
_FP4_NIBBLE_OF_TOP16 = (
    (np.clip((_TOP16 >> 7) & 0xFF, 120, 127) - 120) | ((_TOP16 >> 15) << 3)
).astype(np.uint8)
_FP4_HIGH_NIBBLE_OF_TOP16 = _FP4_NIBBLE_OF_TOP16 << 4
del _TOP16
# Byte -> its two values (low nibble first) as one 8-byte word, so a gather yields float32 pairs.
FP4_PAIRS = (
    np.stack([_FP4_LUT[np.arange(256) & 15], _FP4_LUT[np.arange(256) >> 4]], axis=1)
    .view(np.uint64)
    .reshape(256)
)


def values_per_byte(codec: str) -> int:
  return {"2bit": 4, "1bit": 8}[codec]


def _blocked(x_N: np.ndarray, block: int) -> tuple[np.ndarray, int]:
  """x padded with zeros to whole blocks, as (nb, block); and the pad."""
  pad = (-x_N.size) % block
  return np.concatenate([x_N, np.zeros(pad, np.float32)]).reshape(-1, block), pad


def block_scales(x_N: np.ndarray, block: int, codec: str) -> np.ndarray:
  """The scale of every block: max|x| (2bit, fp4) or mean|x| over the block's own values (1bit);
  0 where max|x| < 2^-100."""
  a_BxK, pad = _blocked(np.abs(x_N), block)
  if not a_BxK.size:
    return np.zeros(0, np.float32)
  amax = a_BxK.max(axis=1)
  if codec == "1bit":
    counts = np.full(a_BxK.shape[0], block, np.float32)
    counts[-1] -= pad
    s = (a_BxK.sum(axis=1, dtype=np.float64) / counts).astype(np.float32)
  else:
    s = amax
  return np.where(amax >= TINY, s, np.float32(0)).astype(np.float32)


def _per_value(scale: np.ndarray, n: int, block: int) -> np.ndarray:
  return np.repeat(scale, block)[:n]


def encode(x_N: np.ndarray, codec: str, block: int) -> bytes:
  """Payload of ``2bit`` or ``1bit``: float32 scales, then the packed codes."""
  scale = block_scales(x_N, block, codec)
  if codec == "1bit":
    bits = np.packbits(np.signbit(x_N) & (x_N != 0), bitorder="little")
    return scale.astype(F32).tobytes() + bits.tobytes()
  s = _per_value(scale, x_N.size, block)
  big = np.abs(x_N) * np.float32(3) >= np.float32(2) * s
  code = ((np.signbit(x_N) & (x_N != 0)).astype(np.uint8) << 1) | big.astype(np.uint8)
  code = np.concatenate([code, np.zeros((-code.size) % 4, np.uint8)]).reshape(-1, 4)
  packed = np.bitwise_or.reduce(code << _SHIFTS2, axis=1).astype(np.uint8)
  return scale.astype(F32).tobytes() + packed.tobytes()


def decode(body: np.ndarray, scale: np.ndarray, codec: str, n: int, block: int) -> np.ndarray:
  """float32 [n] values from the packed codes ``body`` (uint8) and the block scales."""
  s = _per_value(scale, n, block)
  if codec == "1bit":
    neg = np.unpackbits(body, count=n, bitorder="little").astype(bool)
    return np.where(neg, -s, s).astype(np.float32)
  codes = ((body[:, None] >> _SHIFTS2) & 3).reshape(-1)[:n]
  return (_LEVELS2[codes] * s).astype(np.float32)


def fp4_magnitude_codes(
    x_N: np.ndarray, amax: np.ndarray, block: int, rounding: str, rng: np.random.Generator | None
) -> np.ndarray:
  """fp4 nibbles (sign << 3 | code, uint8 [n]) by ``linear`` or ``stochastic`` rounding.

  From the float32 r = |x|/s (<= 1): for r >= 2^-6 its biased exponent b gives the lower level
  lo = 2^(b-127), code b - 120, and its mantissa the fraction f = r/lo - 1 of the way to 2·lo; so
  linear-nearest goes up when f >= 1/2 (the mantissa's top bit) and stochastic when a uniform
  draw is below f. Below 2^-6 the levels are 0 and 2^-6 and the fraction is 64·r.
  """
  if rounding == "stochastic" and rng is None:
    raise ValueError("stochastic rounding needs a random generator (rng)")
  s = _per_value(amax, x_N.size, block)
  r = np.divide(np.abs(x_N), s, out=np.zeros_like(x_N), where=s > 0)
  bits = r.view(np.uint32)
  biased = bits >> 23
  small = biased < 121  # r < 2^-6
  code = np.where(small, 0, np.minimum(biased, 127) - 120).astype(np.uint8)
  if rounding == "linear":
    up = np.where(small, r >= np.float32(2.0**-7), (bits & (1 << 22)) != 0)
  else:
    frac = np.where(small, r.astype(np.float64) * 64.0, (bits & 0x7FFFFF) * 2.0**-23)
    up = rng.random(r.size) < frac
  code += (up & (code < 7)).astype(np.uint8)
  sign = (np.signbit(x_N) & (code > 0)).astype(np.uint8)
  return code | (sign << 3)


def fp4_log_nibbles(y: np.ndarray, out: np.ndarray) -> None:
  """Log-nearest fp4 nibbles of y = x·√2/s (float32 [n], |y| <= √2), packed into ``out`` uint8
  [(n + 1) // 2].

  Log-space rounding of r = |x|/s to 2^round(log2 r) is 2^floor(log2(√2·r)): the exponent field of
  the float32 √2·r. So the top 16 bits of y (sign, exponent, 7 mantissa bits) index tables of low
  and high nibbles.
  """
  top16 = y.view(np.uint16)[1::2] if sys.byteorder == "little" else y.view(np.uint16)[0::2]
  np.take(_FP4_NIBBLE_OF_TOP16, top16[0::2], out=out, mode="clip")  # indices are all in range
  out[: y.size // 2] |= np.take(_FP4_HIGH_NIBBLE_OF_TOP16, top16[1::2], mode="clip")


def pack_nibbles(nibbles: np.ndarray) -> np.ndarray:
  """Two nibbles per byte, value 2i in the low nibble; an odd count gets a zero pad nibble."""
  if nibbles.size % 2:
    nibbles = np.concatenate([nibbles, np.zeros(1, np.uint8)])
  return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def error_bound(codec: str, a: np.ndarray, s: np.ndarray, rounding: str = "log") -> np.ndarray:
  """Per-element bound (float64) for |x| = ``a`` with block scales ``s`` (per value, as stored)."""
  if codec == "2bit":
    return s / 3
  if codec == "1bit":
    return np.abs(a - s)
  if rounding == "linear":
    return np.maximum(a / 3, s * 2.0**-7)
  return np.maximum(a, s * 2.0**-6)  # stochastic
