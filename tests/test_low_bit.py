"""The 2-bit and 1-bit codecs, fp4's linear and stochastic roundings and uplink error feedback,
with numbers worked out by hand."""

import struct

import numpy as np
import pytest

from diloco.outer.codecs import blockwise, compression, low_bit
from diloco.outer.codecs.uplink import Uplink

F32 = np.float32


def _scale_bytes(*scales: float) -> bytes:
  return b"".join(struct.pack("<f", s) for s in scales)


def test_2bit_four_symmetric_levels_packed_four_per_byte():
  # s = max|x| = 0.9; |x| >= 2s/3 = 0.6 goes to s, below to s/3 = 0.3.
  x = np.array([0.9, -0.2, 0.5, -0.7], F32)
  e = compression.encode(x, "2bit", block=4)
  # codes sign << 1 | big: 0.9 -> 1, -0.2 -> 2, 0.5 -> 0, -0.7 -> 3; 1 | 2<<2 | 0<<4 | 3<<6 = 201.
  assert e.payload == _scale_bytes(0.9) + bytes([201])
  np.testing.assert_allclose(compression.decode(e), [0.9, -0.3, 0.3, -0.9], rtol=1e-6)


def test_1bit_is_sign_times_the_blocks_mean_magnitude():
  # Block 1 (the first four): mean |x| = 2.3 / 4 = 0.575; block 2 (one value, short): 0.25.
  x = np.array([0.9, -0.2, 0.5, -0.7, -0.25], F32)
  e = compression.encode(x, "1bit", block=4)
  assert e.nbytes == 2 * 4 + 1  # two scales, five bits in one byte
  # Negatives at 1, 3 and 4: bits 0b11010 = 26.
  assert e.payload == _scale_bytes(0.575, 0.25) + bytes([26])
  np.testing.assert_allclose(
      compression.decode(e), [0.575, -0.575, 0.575, -0.575, -0.25], rtol=1e-6
  )


@pytest.mark.parametrize(
    "codec,n,expected",
    [("2bit", 1000, 4 * 4 + 250), ("2bit", 1001, 4 * 4 + 251), ("1bit", 1000, 4 * 4 + 125)],
)
def test_low_bit_byte_counts(codec, n, expected):
  # block 256: four scales for 1,000 values; 2-bit 4 values a byte, 1-bit 8 (rounded up).
  assert compression.encoded_nbytes(codec, n) == expected
  assert compression.encode(np.ones(n, F32), codec).nbytes == expected


def test_fp4_linear_and_log_rounding_part_at_the_arithmetic_and_geometric_means():
  # s = 1; between 0.5 and 1 log-nearest switches at 2^-0.5 = 0.7071, linear-nearest at 0.75.
  # Near zero: log drops below 2^-6.5 = 0.01105, linear below 2^-7 = 0.0078 (half of 2^-6).
  x = np.array([1.0, 0.72, 0.74, 0.76, -0.72, 0.01, 0.005], F32)
  log = compression.decode(compression.encode(x, "fp4", rounding="log"))
  lin = compression.decode(compression.encode(x, "fp4", rounding="linear"))
  np.testing.assert_array_equal(log, F32([1, 1, 1, 1, -1, 0, 0]))
  np.testing.assert_array_equal(lin, F32([1, 0.5, 0.5, 1, -0.5, 2**-6, 0]))


def test_fp4_stochastic_rounding_is_unbiased_and_reproducible():
  # r = 0.75 sits between 0.5 and 1: up with probability 1/2; a value on a level never moves.
  x = np.concatenate([[1.0], np.full(20_000, 0.75), [0.5, 0.25]]).astype(F32)
  decoded = compression.decode(
      compression.encode(
          x, "fp4", block=len(x), rounding="stochastic", rng=np.random.default_rng(0)
      )
  )
  assert set(np.unique(decoded[1:-2])) == {0.5, 1.0}
  # Mean of 20,000 draws of ±0.25 around 0.75: standard error 0.25/sqrt(20000) = 0.0018.
  assert abs(decoded[1:-2].mean() - 0.75) < 4 * 0.0018
  assert decoded[-2:].tolist() == [0.5, 0.25]
  again = compression.encode(
      x, "fp4", block=len(x), rounding="stochastic", rng=np.random.default_rng(0)
  )
  assert compression.decode(again).tolist() == decoded.tolist()
  with pytest.raises(ValueError, match="random generator"):
    compression.encode(x, "fp4", rounding="stochastic")


def test_gaussian_inner_product_by_rounding():
  """The issue's measurement: log-nearest lengthens a Gaussian (<x̂, x>/<x, x> > 1), linear
  shortens it less than it zeroes, stochastic is unbiased (ratio 1 within noise)."""
  x = np.random.default_rng(1).standard_normal(1 << 16).astype(F32)
  ratio = {}
  for r in compression.ROUNDINGS:
    d = compression.decode(compression.encode(x, "fp4", rounding=r, rng=np.random.default_rng(2)))
    ratio[r] = float(np.dot(d, x) / np.dot(x, x))
  assert 1.01 < ratio["log"] < 1.05
  assert ratio["linear"] < ratio["log"]
  assert abs(ratio["stochastic"] - 1) < 0.01
  # 1-bit sends sign(x)·E|x|: <x̂, x>/<x, x> = (E|x|)² / E[x²] = 2/π for a Gaussian.
  d = compression.decode(compression.encode(x, "1bit"))
  assert abs(float(np.dot(d, x) / np.dot(x, x)) - 2 / np.pi) < 0.01


@pytest.mark.parametrize(
    "codec,rounding", [("2bit", "log"), ("1bit", "log"), ("fp4", "linear"), ("fp4", "stochastic")]
)
def test_errors_stay_within_the_documented_bounds(codec, rounding):
  rng = np.random.default_rng(3)
  x = (rng.standard_normal(5000) * np.exp(rng.standard_normal(5000))).astype(F32)
  d = compression.decode(compression.encode(x, codec, block=64, rounding=rounding, rng=rng))
  bound = compression.error_bound(codec, x, block=64, rounding=rounding)
  assert np.all(np.abs(d.astype(np.float64) - x) <= bound)


def test_unknown_codec_and_rounding_name_the_choices():
  with pytest.raises(ValueError, match="unknown codec '3bit'"):
    compression.encode(np.ones(4, F32), "3bit")
  with pytest.raises(ValueError, match="unknown fp4 rounding 'up'"):
    compression.encode(np.ones(4, F32), "fp4", rounding="up")
  with pytest.raises(ValueError, match="unknown fp4 rounding 'up'"):
    Uplink("fp4", rounding="up")


def test_error_feedback_sends_next_time_what_the_codec_dropped():
  # 1-bit, one block of two values. Upload 1: Δ = [0.3, -0.1], s = 0.2: sends [0.2, -0.2] and
  # keeps e = [0.1, 0.1]. Upload 2: the same Δ plus e = [0.4, 0.0], s = 0.2: sends [0.2, 0.2]
  # (0 counts as +) and keeps e = [0.2, -0.2]. Sent plus residual is always the sum of the Δs.
  up = Uplink("1bit", error_feedback=True)
  base, local = {"w": F32([0.3, -0.1])}, {"w": F32([0.0, 0.0])}
  first = compression.decode(up.encode(0, base, local)["w"])
  np.testing.assert_allclose(first, [0.2, -0.2], rtol=1e-6)
  np.testing.assert_allclose(up.residuals[0]["w"], [0.1, 0.1], rtol=1e-6)
  second = compression.decode(up.encode(0, base, local)["w"])
  np.testing.assert_allclose(second, [0.2, 0.2], rtol=1e-6)
  np.testing.assert_allclose(first + second + up.residuals[0]["w"], [0.6, -0.2], rtol=1e-6)
  plain = Uplink("1bit")
  plain.encode(0, base, local)
  assert plain.residuals == {}  # without feedback nothing is kept
  np.testing.assert_allclose(compression.decode(plain.encode(0, base, local)["w"]), first)


def test_residuals_are_per_fragment_and_zero_before_the_first_upload():
  up = Uplink("2bit", error_feedback=True)
  up.encode(1, {"a": F32([0.9, 0.5])}, {"a": F32([0.0, 0.0])})
  # s = 0.9: 0.5 < 0.6 goes to 0.3, residual 0.2; 0.9 exact.
  np.testing.assert_allclose(up.residual_of(1, {"a": (2,)})["a"], [0.0, 0.2], atol=1e-7)
  assert up.residual_of(0, {"b": (3,)})["b"].tolist() == [0.0, 0.0, 0.0]
  assert low_bit.values_per_byte("2bit") == 4


def _reference_nibbles(x, s, rounding, rng):
  """fp4 linear/stochastic rounding written from its definition, in float64, one value at a time
  in spirit: bracket r = |x|/s between levels lo < hi of {0, 2^-6, ..., 1}, then choose."""
  r = np.divide(np.abs(x), s, out=np.zeros_like(x), where=s > 0).astype(np.float64)
  levels = np.array([0.0] + [2.0 ** (k - 7) for k in range(1, 8)])
  lo_code = np.searchsorted(levels, r, side="right") - 1
  hi_code = np.minimum(lo_code + 1, 7)
  lo, hi = levels[lo_code], levels[hi_code]
  span = np.where(hi > lo, hi - lo, 1.0)
  up = (r - lo >= hi - r) if rounding == "linear" else rng.random(r.size) < (r - lo) / span
  code = np.where(up & (hi > lo), hi_code, lo_code).astype(np.uint8)
  return code | ((np.signbit(x) & (code > 0)).astype(np.uint8) << 3)


@pytest.mark.parametrize("rounding", ["linear", "stochastic"])
def test_fp4_bit_tricks_equal_the_plain_definition(rounding):
  rng = np.random.default_rng(4)
  x = (rng.standard_normal(4096) * np.exp(3 * rng.standard_normal(4096))).astype(F32)
  x[:8] = [0.0, -0.0, 1.0, 0.75, 2.0**-7, -(2.0**-6), 1.5 * 2.0**-6, 3.0]
  s = np.repeat(blockwise.block_amax(x, 256), 256)[: x.size]
  fast = low_bit.fp4_magnitude_codes(
      x, blockwise.block_amax(x, 256), 256, rounding, np.random.default_rng(5)
  )
  np.testing.assert_array_equal(fast, _reference_nibbles(x, s, rounding, np.random.default_rng(5)))
