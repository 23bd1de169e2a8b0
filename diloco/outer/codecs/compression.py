"""Outer-gradient codecs: fp32, bf16, int8, fp4 E3M0, 2-bit and 1-bit, with exact wire byte counts.

Everything here is host-side numpy, vectorised over values. A payload is the exact byte string that
would go on the wire: little-endian, per-block float32 scales first (all but fp32 and bf16), then
the values.

Codecs and their per-element error bounds (``error_bound`` computes them; x is the input after the
cast to float32, s the scale of the value's block):

- ``fp32``: raw float32, exact.
- ``bf16``: round to nearest, ties to even, on bfloat16 (8 significant bits):
  |x̂ - x| <= 2^-8·|x| (or half the subnormal spacing, 2^-134). A value whose rounding overflows
  bfloat16 raises ValueError.
- ``int8``: per block, s = max|x|/127 and q = round(x/s) in [-127, 127] (computed as
  x·(127/max|x|)): |x̂ - x| <= s/2.
- ``fp4`` (E3M0: 1 sign bit, 3 exponent bits, no mantissa): per block, s = max|x|; code 0 is zero
  and code k in 1..7 is the magnitude s·2^(k-7), i.e. {0, s/64, s/32, s/16, s/8, s/4, s/2, s}. A
  value is rounded to the nearest magnitude *in log space* (|x| between s·2^(j-1) and s·2^j goes to
  the one whose exponent is nearer to log2|x|, the boundary being the geometric mean s·2^(j-1/2));
  |x| < s·2^-6.5 becomes zero. So |x̂ - x| <= (√2 - 1)·|x| for values kept, and
  |x̂ - x| = |x| < s·2^-6.5 for values dropped. Two values per byte: value 2i in the low nibble,
  value 2i+1 in the high nibble, each nibble ``sign << 3 | code``; an odd count is padded with a
  zero nibble. That is ``rounding="log"``; ``linear`` and ``stochastic`` (low_bit.py) write the
  same nibbles, so decoding does not depend on the rounding.
- ``2bit`` (four symmetric levels ±s/3, ±s with s = max|x|) and ``1bit`` (sign times the block's
  mean |x|): low_bit.py.

The last block of an array whose size is not a multiple of ``block`` is simply shorter; its scale
covers only the values it holds. For int8 and fp4, a block whose max|x| is below 2^-100 decodes as
zeros (this keeps scales and reciprocals normal floats), and ``error_bound`` adds 2^-21·max|x| of
the block for float32 rounding of scales and products.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping

import ml_dtypes  # installed with jax
import numpy as np

from diloco.outer import parallel
from diloco.outer.codecs import blockwise, low_bit

CODECS = ("fp32", "bf16", "int8", "fp4", "2bit", "1bit")
ROUNDINGS = low_bit.ROUNDINGS  # of fp4 values
DEFAULT_BLOCK = 256

SCALE_BYTES = 4
_F32, _TINY = low_bit.F32, low_bit.TINY  # wire float; blocks below TINY decode as zeros
_U16 = np.dtype("<u2")
# The smallest |x| whose bfloat16 rounding is Inf: bf16 max (0x7F7F) plus half an ulp, a tie to odd.
_BF16_OVERFLOW = np.uint32(0x7F7F8000).view(np.float32)


@dataclasses.dataclass(frozen=True)
class Encoded:
  """One encoded tensor: codec, original shape, wire bytes (scales included), block size."""

  codec: str
  shape: tuple[int, ...]
  payload: bytes
  block: int

  def __post_init__(self):
    _check_codec(self.codec, self.block)
    if not isinstance(self.shape, tuple) or any(
        not isinstance(d, (int, np.integer)) or d < 0 for d in self.shape
    ):
      raise ValueError(f"shape must be a tuple of non-negative ints, got {self.shape!r}")

  @property
  def nbytes(self) -> int:
    return len(self.payload)

  @property
  def num_values(self) -> int:
    return math.prod(self.shape)


def _check_codec(codec: str, block: int) -> None:
  if codec not in CODECS:
    raise ValueError(f"unknown codec {codec!r}; expected one of {CODECS}")
  if not isinstance(block, (int, np.integer)) or block < 1:
    raise ValueError(f"block must be a positive integer, got {block!r}")


def encoded_nbytes(codec: str, num_values: int, block: int = DEFAULT_BLOCK) -> int:
  """Exact payload size of ``encode`` for ``num_values`` values (``encode(...).nbytes``)."""
  _check_codec(codec, block)
  if num_values < 0:
    raise ValueError(f"num_values must be >= 0, got {num_values}")
  if codec == "fp32":
    return 4 * num_values
  if codec == "bf16":
    return 2 * num_values
  scales = SCALE_BYTES * blockwise.num_blocks(num_values, block)
  if codec == "int8":
    return scales + num_values
  if codec == "fp4":
    return scales + (num_values + 1) // 2
  per = low_bit.values_per_byte(codec)
  return scales + -(-num_values // per)


def _as_f32(x: np.ndarray) -> np.ndarray:
  """Flat float32 view (or copy) of ``x``; ValueError for dtypes that are not real numbers."""
  x = np.asarray(x)
  # 'V' admits ml_dtypes floats (bfloat16 from jax); a structured dtype fails the cast below.
  if x.dtype.kind not in "fiuV":
    raise ValueError(f"can only encode real numbers, got dtype {x.dtype}")
  try:
    with np.errstate(over="ignore"):  # overflow to Inf is reported as non-finite below
      x_N = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
  except (TypeError, ValueError) as err:
    raise ValueError(f"cannot cast dtype {x.dtype} to float32 for encoding") from err
  return x_N


class NonFiniteError(ValueError):
  """Values to encode hold NaN or Inf."""


def _check_finite(amax: np.ndarray, x_N: np.ndarray) -> None:
  """ValueError if ``amax`` (max|x| of x_N or of its blocks; NaN propagates) is not all finite."""
  if amax.size and not np.isfinite(amax).all():
    _raise_non_finite(x_N)


def _raise_non_finite(x_N: np.ndarray) -> None:
  bad = int(np.count_nonzero(~np.isfinite(x_N)))
  raise NonFiniteError(
      f"cannot encode non-finite values: {bad} of {x_N.size} are NaN or Inf "
      "(after the cast to float32)"
  )


def _amax(x_N: np.ndarray) -> np.ndarray:
  """max|x| as a float32 array of 0 or 1 element, without a temporary the size of x."""
  if not x_N.size:
    return np.zeros(0, np.float32)
  return np.maximum(x_N.max(keepdims=True), -x_N.min(keepdims=True))


def _bf16_bits(x_N: np.ndarray, amax: np.ndarray) -> np.ndarray:
  """Round-to-nearest-even bfloat16 bit patterns (ml_dtypes' cast), little-endian uint16 [n]."""
  if amax.size and amax[0] >= _BF16_OVERFLOW:
    raise ValueError(f"value too large for bfloat16: max |x| = {float(amax[0])!r} rounds to Inf")
  return x_N.astype(ml_dtypes.bfloat16).view(np.uint16).astype(_U16, copy=False)


def _check_rounding(rounding: str) -> None:
  if rounding not in ROUNDINGS:
    raise ValueError(f"unknown fp4 rounding {rounding!r}; expected one of {ROUNDINGS}")


def encode(
    x: np.ndarray,
    codec: str,
    block: int = DEFAULT_BLOCK,
    rounding: str = "log",
    rng: np.random.Generator | None = None,
) -> Encoded:
  """Encodes an array (cast to float32) with ``codec``; ValueError on NaN/Inf.

  ``rounding`` (fp4 only): log | linear | stochastic, the last drawing from ``rng``.
  """
  _check_codec(codec, block)
  _check_rounding(rounding)
  shape = tuple(int(d) for d in np.shape(x))
  x_N = _as_f32(x)
  n = x_N.size
  if codec in ("fp32", "bf16", "2bit", "1bit"):
    amax = _amax(x_N)
    _check_finite(amax, x_N)
    if codec == "fp32":
      return Encoded(codec, shape, x_N.astype(_F32, copy=False).tobytes(), block)
    if codec == "bf16":
      return Encoded(codec, shape, _bf16_bits(x_N, amax).tobytes(), block)
    return Encoded(codec, shape, low_bit.encode(x_N, codec, block), block)
  if codec == "fp4" and rounding != "log":
    amax = blockwise.block_amax(x_N, block)  # NaN propagates: one pass checks and scales
    _check_finite(amax, x_N)
    scale = blockwise.usable_scale(amax)
    nibbles = low_bit.fp4_magnitude_codes(x_N, scale, block, rounding, rng)
    payload = scale.astype(_F32).tobytes() + low_bit.pack_nibbles(nibbles).tobytes()
    return Encoded(codec, shape, payload, block)
  nb = blockwise.num_blocks(n, block)
  out = np.empty(encoded_nbytes(codec, n, block), np.uint8)
  scales, body = out[: SCALE_BYTES * nb].view(_F32), out[SCALE_BYTES * nb :]
  step = blockwise.chunk_values(block)
  tmp = np.empty(min(step, n), np.float32)
  for c0 in range(0, n, step):  # whole blocks per chunk, so scales and bytes split evenly
    if not blockwise.encode_chunk(codec, x_N, c0, min(c0 + step, n), block, tmp, scales, body):
      _raise_non_finite(x_N)
  return Encoded(codec, shape, out.tobytes(), block)


def decode(e: Encoded) -> np.ndarray:
  """Decodes to a new, writable float32 array of the original shape; ValueError on bad length."""
  n = e.num_values
  if e.codec not in ("int8", "fp4"):
    ((_, x_N),) = decode_chunks(e)
    return x_N.reshape(e.shape)
  x_N = np.empty(n + n % 2, np.float32)  # fp4 decodes whole bytes: room for the pad nibble
  for _ in decode_chunks(e, x_N):
    pass
  return x_N[:n].reshape(e.shape)


def decode_chunks(e: Encoded, out: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray]]:
  """Decodes chunk by chunk, yielding (index of the first value, float32 values of the chunk).

  int8 and fp4 decode into ``out`` (flat float32 with room for n + n % 2 values) when given, else
  into one scratch chunk that the next chunk overwrites; the other codecs yield one new array.
  ValueError on a payload of the wrong length.
  """
  n = e.num_values
  expected = encoded_nbytes(e.codec, n, e.block)
  if e.nbytes != expected:
    raise ValueError(
        f"corrupt payload: {e.nbytes} bytes, but {e.codec} with {n} values and "
        f"block {e.block} takes {expected}"
    )
  buf = np.frombuffer(e.payload, np.uint8)
  if e.codec == "fp32":
    yield 0, buf.view(_F32).astype(np.float32)
    return
  if e.codec == "bf16":
    yield 0, buf.view(_U16).astype(np.uint16, copy=False).view(ml_dtypes.bfloat16).astype(
        np.float32
    )
    return
  nb = blockwise.num_blocks(n, e.block)
  scale = buf[: SCALE_BYTES * nb].view(_F32).astype(np.float32)
  body = buf[SCALE_BYTES * nb :]
  if e.codec in ("2bit", "1bit"):
    yield 0, low_bit.decode(body, scale, e.codec, n, e.block)
    return
  step = blockwise.chunk_values(e.block)
  scratch = np.empty(min(step, n + n % 2), np.float32) if out is None else None
  for c0 in range(0, n, step):
    size = min(step, n - c0)
    room = out[c0 : c0 + size + size % 2] if out is not None else scratch[: size + size % 2]
    b0 = c0 // e.block
    scale_c = scale[b0 : b0 + blockwise.num_blocks(size, e.block)]
    yield c0, blockwise.decode_chunk(e.codec, body, scale_c, c0, size, e.block, room)


def error_bound(
    codec: str, x: np.ndarray, block: int = DEFAULT_BLOCK, rounding: str = "log"
) -> np.ndarray:
  """Per-element bound on |decode(encode(x)) - x| (float64, shape of x), float rounding included.

  For the codecs with scales a block whose max|x| is below 2^-100 is flushed to zero: its bound is
  2^-100.
  """
  _check_codec(codec, block)
  _check_rounding(rounding)
  x_N = _as_f32(x)
  a = np.abs(x_N).astype(np.float64)
  if codec == "fp32":
    bound = np.zeros_like(a)
  elif codec == "bf16":
    bound = np.maximum(a * 2.0**-8, 2.0**-134)
  else:
    amax = blockwise.block_amax(x_N, block).astype(np.float64)
    s = np.repeat(amax, block)[: a.size]
    slack = s * 2.0**-21  # float32 rounding of the scale, the reciprocal and the products
    if codec == "int8":
      bound = s / 254 + slack
    elif codec == "fp4" and rounding == "log":
      bound = np.maximum((math.sqrt(2) - 1) * a, s * 2.0**-6.5) + slack
    else:
      stored = low_bit.block_scales(x_N, block, codec).astype(np.float64)  # mean|x| for 1bit
      bound = low_bit.error_bound(codec, a, np.repeat(stored, block)[: a.size], rounding) + slack
    bound = np.where(s < _TINY, _TINY, bound)
  return bound.reshape(np.shape(x))


def encode_tree(
    arrays: Mapping[str, np.ndarray],
    codec: str,
    block: int = DEFAULT_BLOCK,
    rounding: str = "log",
    rng: np.random.Generator | None = None,
) -> dict[str, Encoded]:
  """Encodes every array of a path-keyed flat dict (``rounding``, ``rng``: as ``encode``).

  The arrays are encoded on `parallel.THREADS` threads, except with stochastic rounding (one
  generator draws for all of them, in order).
  """
  if rounding == "stochastic":
    return {path: encode(x, codec, block, rounding, rng) for path, x in arrays.items()}
  coded = parallel.run(lambda x: encode(x, codec, block, rounding, rng), arrays.values())
  return dict(zip(arrays, coded))


def decode_tree(encoded: Mapping[str, Encoded]) -> dict[str, np.ndarray]:
  """Decodes every entry of a path-keyed dict of ``Encoded``."""
  return {path: decode(e) for path, e in encoded.items()}


def tree_nbytes(encoded: Mapping[str, Encoded]) -> int:
  """Total wire bytes of a path-keyed dict of ``Encoded``."""
  return sum(e.nbytes for e in encoded.values())


def decoded_view(e: Encoded) -> np.ndarray:
  """Decoded values to merge; fp32 payloads are viewed in place, not copied."""
  if e.codec == "fp32":
    return np.frombuffer(e.payload, "<f4").reshape(e.shape)
  return decode(e)


class Decoded(Mapping):
  """An upload's delta by path, each leaf decoded when it is read and not kept (fp32 payloads
  viewed in place), times `factor` when one is given: a merge round holds one leaf of each
  upload decoded at a time, not M whole fragments (merging.merge_checked)."""

  def __init__(self, encoded: Mapping[str, Encoded], factor: float | None = None):
    self.encoded = encoded
    self.factor = None if factor is None else np.float32(factor)

  def __getitem__(self, path: str) -> np.ndarray:
    x = decoded_view(self.encoded[path])
    return x if self.factor is None else x * self.factor

  def __iter__(self) -> Iterator[str]:
    return iter(self.encoded)

  def __len__(self) -> int:
    return len(self.encoded)

  def scaled(self, factor: float) -> Decoded:
    """The same delta times `factor` (once: a clipped upload)."""
    if self.factor is not None:
      raise ValueError("an upload's delta is scaled once")
    return Decoded(self.encoded, factor)

  def copy_bytes(self, path: str) -> int:
    """The bytes a read of `path` allocates (0: an fp32 view)."""
    e = self.encoded[path]
    return 0 if e.codec == "fp32" and self.factor is None else 4 * math.prod(e.shape)


def add_decoded(old: np.ndarray, update: Encoded, raw: np.ndarray, check: bool = False):
  """old + decoded update, a new array; raw − decoded update (the residual) in place of raw.

  With `check`, (new, whether new and the residual are all finite), checked chunk by chunk while
  they are in cache.
  """
  new = np.empty_like(old)
  old_N, new_N, raw_N = old.reshape(-1), new.reshape(-1), raw.reshape(-1)
  finite = True
  for c0, d in decode_chunks(update):
    n, r = new_N[c0 : c0 + d.size], raw_N[c0 : c0 + d.size]
    np.add(old_N[c0 : c0 + d.size], d, out=n)
    np.subtract(r, d, out=r)
    if check and finite:
      finite = bool(np.isfinite(n).all() and np.isfinite(r).all())
  return (new, finite) if check else new
