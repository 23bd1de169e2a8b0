"""The outer step's fast path, one compiled loop (numba): the SGD step, and for an fp4 downlink
the encoding of the update, its decoding applied to the global values, and the residual, block by
block while in cache.

optax is the reference (`optimizers.nesterov`, op by op on the host); this loop is the one other
place the step is written. The bits are the reference's (`tx.update` + plus, then
`compression.encode` and `compression.add_decoded`): every operation is the same float32 operation
in the same order (no fast-math, so no fused multiply-add). tests/test_kernels.py holds that
contract. numpy's passes over every chunk made about fifteen, two of them gathers at about 1.4 ns
a value; this loop makes one: 25 ms against 62-77 ms for a 64 MiB fragment with fp4 on one thread
(`scripts/bench_sync.py --threads=1`).

The fp4 nibble of r = |x|/s is sign << 3 | c, where c counts the magnitudes 2^-6 ... 1 at or below
y = |x·(√2/s)| (log rounding, compression.py): the same c as y's biased exponent clipped to
120..127, less 120. Its decoding ±2^(c-7) (±0 for c = 0) times s is built from bits.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from diloco.outer import parallel
from diloco.outer.codecs import blockwise, compression, low_bit

_TINY = low_bit.TINY
_SQRT2 = np.float32(math.sqrt(2))
_ABS_BITS, _SIGN_BIT, _EXP_ALL_ONES = 0x7FFFFFFF, 0x80000000, 0x7F800000
_FLOAT_MAX = np.float32(np.finfo(np.float32).max)
FINITE, NOT_FINITE, RAW_NOT_FINITE = 0, 1, 2  # what a span returns
CHUNK = 1 << 17  # values per block of the step alone: 512 KiB of float32

_kernel = None


def _compiled():
  """The numba kernel, compiled on first use for the one signature every call takes (inputs
  read-only, so optimizer state from jax or a checkpoint does not compile a second version);
  numba's import takes about half a second, the compiled code is cached on disk next to this
  file. `warm_up` calls this before a process serves, so no merge waits on a compile."""
  global _kernel
  if _kernel is None:
    import numba  # pylint: disable=import-outside-toplevel
    from numba import types  # pylint: disable=import-outside-toplevel

    f32 = types.Array(types.float32, 1, "C")
    f32_in = types.Array(types.float32, 1, "C", readonly=True)
    u8 = types.Array(types.uint8, 1, "C")
    i64 = types.int64
    signature = types.int64(
        f32_in, f32_in, f32, f32_in, f32_in, f32, f32, f32, u8,
        types.float32, types.float32, types.boolean, types.boolean, i64, i64, i64,
    )  # fmt: skip
    _kernel = numba.njit(signature, nogil=True, cache=True)(_sgd_span)
  return _kernel


def warm_up() -> None:
  """Compiles (or loads) the kernel now rather than in the first merge round."""
  _compiled()


def _sgd_span(g, t_old, t_new, plus, old, raw, new, scales, body, mu, scale, momentum, fp4,
              start, stop, block):  # fmt: skip
  """Values [start, stop) (start a multiple of 2·block): raw = SGD update + plus; with `fp4`, its
  fp4 encoding into scales and body, new = old + decoding, raw -= decoding; FINITE, NOT_FINITE
  (new or raw), or RAW_NOT_FINITE (nothing encoded past the block that holds a NaN or Inf).
  Without `fp4`, old, new, scales and body are not read and it returns FINITE.

  Loops run over per-block views from index 0 so that LLVM vectorizes them; branches are
  arithmetic on comparisons for the same reason.
  """
  raw_u = raw.view(np.uint32)
  one = np.empty(1, np.uint32)
  one_f = one.view(np.float32)
  nib = np.empty(block if fp4 else 0, np.uint8)
  mag = np.empty(block if fp4 else 0, np.uint32)
  mag_f = mag.view(np.float32)
  bad = np.uint32(0)
  for b0 in range(start, stop, block):
    b1 = min(b0 + block, stop)
    g_b, p_b, o_b, r_b, n_b, ru_b = (
        g[b0:b1],
        plus[b0:b1],
        old[b0:b1],
        raw[b0:b1],
        new[b0:b1],
        raw_u[b0:b1],
    )
    if momentum:  # optax: t = g + mu·t; Nesterov update g + mu·t; times −lr
      to_b, tn_b = t_old[b0:b1], t_new[b0:b1]
      for i in range(g_b.size):
        t = to_b[i] * mu + g_b[i]
        tn_b[i] = t
        r_b[i] = (t * mu + g_b[i]) * scale + p_b[i]
    else:
      for i in range(g_b.size):
        r_b[i] = g_b[i] * scale + p_b[i]
    if not fp4:
      continue
    amax_bits = np.uint32(0)  # max|x| by its bits: integer order is float order for |x|
    for i in range(ru_b.size):
      v = ru_b[i] & np.uint32(_ABS_BITS)
      amax_bits = v if v > amax_bits else amax_bits
    if amax_bits >= np.uint32(_EXP_ALL_ONES):
      return RAW_NOT_FINITE
    one[0] = amax_bits
    amax = one_f[0]
    if not amax >= _TINY:
      amax = np.float32(0)
    scales[b0 // block] = amax
    inv = _SQRT2 / amax if amax > 0 else np.float32(0)
    for i in range(r_b.size):
      y = abs(r_b[i] * inv)
      c = (np.uint32(y >= np.float32(2.0**-6)) + np.uint32(y >= np.float32(2.0**-5))
           + np.uint32(y >= np.float32(2.0**-4)) + np.uint32(y >= np.float32(2.0**-3))
           + np.uint32(y >= np.float32(2.0**-2)) + np.uint32(y >= np.float32(2.0**-1))
           + np.uint32(y >= np.float32(1.0)))  # fmt: skip
      sign = ru_b[i] & np.uint32(_SIGN_BIT)
      mag[i] = (np.uint32(c != 0) * ((c + np.uint32(120)) << np.uint32(23))) | sign
      nib[i] = np.uint8(c | (sign >> np.uint32(28)))
    for i in range(r_b.size):
      d = mag_f[i] * amax
      n = o_b[i] + d
      r = r_b[i] - d
      n_b[i] = n
      r_b[i] = r
      bad |= np.uint32(not abs(n) <= _FLOAT_MAX) | np.uint32(not abs(r) <= _FLOAT_MAX)
    size = b1 - b0
    out = body[b0 // 2 : b0 // 2 + (size + 1) // 2]
    for k in range(size // 2):
      out[k] = nib[2 * k] | (nib[2 * k + 1] << np.uint8(4))
    if size % 2:
      out[size // 2] = nib[size - 1]
  return NOT_FINITE if bad else FINITE


_NONE_F32, _NONE_U8 = np.empty(0, np.float32), np.empty(0, np.uint8)


def _trace_args(trace: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
  return (_NONE_F32, _NONE_F32) if trace is None else trace  # no momentum: never read


def sgd_span(
    tx: Any,
    g: np.ndarray,
    trace: tuple[np.ndarray, np.ndarray] | None,
    plus: np.ndarray,
    out: np.ndarray,
    start: int,
    stop: int,
) -> None:
  """optax's SGD step (t_new ← g + μ·t_old; Nesterov: g + μ·t_new; times −lr) + plus into `out`,
  for flat float32 values [start, stop); `trace` is (t_old, t_new), or None without momentum.
  Elementwise, so any split into spans gives the same bits."""
  _compiled()(
      g, *_trace_args(trace), plus, _NONE_F32, out, _NONE_F32, _NONE_F32, _NONE_U8,
      np.float32(tx.momentum), np.float32(-tx.lr), trace is not None, False, start, stop, CHUNK,
  )  # fmt: skip


class SgdFp4:
  """One float32 tensor's SGD step, fp4 downlink encoding and application, run span by span
  (`span` over `spans()`, in any order or on several threads), then `result()`."""

  def __init__(
      self,
      tx: Any,
      g: np.ndarray,
      trace: tuple[np.ndarray, np.ndarray] | None,
      plus: np.ndarray,
      old: np.ndarray,
      raw: np.ndarray,
      block: int = compression.DEFAULT_BLOCK,
  ):
    self.shape, self.block = tuple(int(d) for d in old.shape), block
    flat = lambda x: np.ascontiguousarray(x, np.float32).reshape(-1)
    self.g, self.plus, self.old = flat(g), flat(plus), flat(old)
    self.raw = raw.reshape(-1)
    if not (self.raw.dtype == np.float32 and self.raw.flags.c_contiguous):
      raise ValueError("raw must be a C-contiguous float32 array")
    self.trace = _trace_args(None if trace is None else (flat(trace[0]), trace[1].reshape(-1)))
    self.momentum = trace is not None
    self.mu, self.scale = np.float32(tx.momentum), np.float32(-tx.lr)
    self.new = np.empty(self.old.size, np.float32)
    n, nb = self.old.size, blockwise.num_blocks(self.old.size, block)
    self.out = np.empty(compression.encoded_nbytes("fp4", n, block), np.uint8)
    self.scales = self.out[: 4 * nb].view(np.float32)
    self.body = self.out[4 * nb :]

  def spans(self) -> list[tuple[int, int]]:
    return parallel.spans(self.old.size, blockwise.chunk_values(self.block))

  def span(self, start: int, stop: int) -> bool | None:
    """Whether new and residual values [start, stop) are finite; None if an update is not."""
    code = _compiled()(
        self.g, *self.trace, self.plus, self.old, self.raw, self.new, self.scales, self.body,
        self.mu, self.scale, self.momentum, True, start, stop, self.block,
    )  # fmt: skip
    return None if code == RAW_NOT_FINITE else code == FINITE

  def result(self) -> tuple[compression.Encoded, np.ndarray]:
    """The encoded tensor and old + its decoding, in old's shape."""
    encoded = compression.Encoded("fp4", self.shape, self.out.tobytes(), self.block)
    return encoded, self.new.reshape(self.shape)
