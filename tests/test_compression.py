"""Outer-gradient codecs: round-trip bounds, exact values, wire bytes, bad input."""

import math
import struct

import ml_dtypes
import numpy as np
import pytest

from diloco.outer.codecs import blockwise, compression as C


def _wide_range(n: int, seed: int = 0) -> np.ndarray:
  """Signed values spread over ~5 decades, float32 [n]."""
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(n) * np.exp(rng.uniform(-8.0, 3.0, n))).astype(np.float32)


@pytest.mark.parametrize("codec", C.CODECS)
@pytest.mark.parametrize("n,block", [(1001, 256), (1001, 7), (256, 256), (3, 1), (10, 5000)])
def test_round_trip_within_stated_bound(codec, n, block):
  x = _wide_range(n, seed=n + block)
  e = C.encode(x, codec, block)
  y = C.decode(e)
  assert y.dtype == np.float32 and y.shape == x.shape
  err = np.abs(y.astype(np.float64) - x)
  assert (err <= C.error_bound(codec, x, block)).all()


def test_error_bounds_are_the_documented_formulas():
  x = np.array([1.0, -0.5, 0.01, 0.0], np.float32)  # one block, max |x| = 1
  s = 1.0
  # rtol: the bounds add a float-rounding slack of 2^-21 times the block max.
  np.testing.assert_allclose(C.error_bound("int8", x, 4), s / 254, rtol=1e-3)
  fp4 = C.error_bound("fp4", x, 4)
  np.testing.assert_allclose(fp4[:2], [(math.sqrt(2) - 1), (math.sqrt(2) - 1) * 0.5], rtol=1e-5)
  np.testing.assert_allclose(fp4[2:], 2.0**-6.5, rtol=1e-4)  # small values: the zero threshold
  np.testing.assert_allclose(C.error_bound("bf16", x, 4)[:3], np.abs(x[:3]) * 2.0**-8)
  assert (C.error_bound("fp32", x, 4) == 0).all()


def test_bounds_are_not_loose_on_random_data():
  # The worst observed error reaches most of the stated bound, so the bounds say something.
  x = _wide_range(20000, seed=3)
  for codec in ("int8", "fp4", "bf16"):
    err = np.abs(C.decode(C.encode(x, codec)).astype(np.float64) - x)
    ratio = err / np.maximum(C.error_bound(codec, x), 1e-300)
    assert ratio.max() > 0.9, codec


def test_fp32_exact():
  x = _wide_range(777)
  np.testing.assert_array_equal(C.decode(C.encode(x, "fp32")), x)


def _bf16_reference(x: np.ndarray) -> np.ndarray:
  """Round to nearest even on float32 bits: add half an ulp (plus 1 if the kept part is odd)."""
  u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  kept = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
  return (kept << 16).astype(np.uint32).view(np.float32)


def test_bf16_matches_bitwise_round_to_nearest_even():
  x = _wide_range(4097, seed=1)
  x[:3] = [1e-40, -3e-39, 2.0**-133]  # float32 subnormals
  np.testing.assert_array_equal(C.decode(C.encode(x, "bf16")), _bf16_reference(x))


def test_bf16_exact_on_bf16_values():
  as_bf16 = _bf16_reference(_wide_range(4097, seed=2))
  np.testing.assert_array_equal(C.decode(C.encode(as_bf16, "bf16")), as_bf16)
  from_jax_dtype = as_bf16.astype(ml_dtypes.bfloat16)  # a bfloat16 input is accepted as is
  np.testing.assert_array_equal(C.decode(C.encode(from_jax_dtype, "bf16")), as_bf16)


def test_bf16_ties_go_to_even():
  # bf16 keeps 8 significant bits: around 1 the spacing is 2^-7, so 1 + 2^-8 is a tie.
  x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 1 + 2.0**-8 + 2.0**-20], np.float32)
  want = np.array([1.0, 1 + 2.0**-6, -1.0, 1 + 2.0**-7], np.float32)
  np.testing.assert_array_equal(C.decode(C.encode(x, "bf16")), want)


def test_int8_exact_on_multiples_of_the_scale():
  # max |x| = 127/8, so s = 1/8 and every k/8 with |k| <= 127 is representable.
  x = np.arange(-127, 128, dtype=np.float32) / 8
  np.testing.assert_array_equal(C.decode(C.encode(x, "int8", block=len(x))), x)


def test_int8_payload_by_hand():
  x = np.array([0.5, -1.27, 0.0, 1.0], np.float32)  # blocks [0.5, -1.27, 0], [1.0]
  e = C.encode(x, "int8", block=3)
  s0, s1 = np.float32(1.27) / np.float32(127), np.float32(1.0) / np.float32(127)
  want = struct.pack("<ff", s0, s1) + np.array([50, -127, 0, 127], np.int8).tobytes()
  assert e.payload == want
  np.testing.assert_allclose(C.decode(e), x, rtol=1e-6)


def test_fp4_exact_on_scaled_powers_of_two_with_signs():
  s = np.float32(3.0)
  mags = [s * np.float32(2.0**-k) for k in range(7)] + [np.float32(0.0)]
  x = np.array([m * sign for m in mags for sign in (1, -1)], np.float32)  # 16 values, max |x| = s
  np.testing.assert_array_equal(C.decode(C.encode(x, "fp4", block=16)), x)


def test_fp4_rounds_in_log_space_against_a_float64_reference():
  x = _wide_range(5000, seed=2)
  block = 64
  y = C.decode(C.encode(x, "fp4", block)).astype(np.float64)
  s_blocks = [np.abs(x[i : i + block]).max() for i in range(0, len(x), block)]
  s = np.repeat(np.array(s_blocks, np.float64), block)[: len(x)]
  log_r = np.log2(np.abs(x) / s, where=x != 0, out=np.full(len(x), -np.inf))
  k = np.round(log_r)
  want = np.where(log_r < -6.5, 0.0, np.sign(x) * s * 2.0**k)
  near_boundary = np.abs(log_r - np.floor(log_r) - 0.5) < 1e-5
  assert (y == want)[~near_boundary].all()
  assert near_boundary.mean() < 1e-3


def test_fp4_boundaries():
  s = 1.0
  eps = 1e-4
  x = np.array(
      [
          s,
          s * 2**-0.5 * (1 + eps),
          s * 2**-0.5 * (1 - eps),  # between s/2 and s
          s * 2**-6.5 * (1 + eps),
          s * 2**-6.5 * (1 - eps),
      ],  # the zero threshold
      np.float32,
  )
  want = np.array([1.0, 1.0, 0.5, 1 / 64, 0.0], np.float32)
  np.testing.assert_array_equal(C.decode(C.encode(x, "fp4", block=8)), want)


def test_fp4_packs_two_values_per_byte_low_nibble_first():
  x = np.array([2.0, -1.0, 0.0], np.float32)  # codes 7, 8|6 (negative s/2), 0
  e = C.encode(x, "fp4", block=3)
  assert e.payload == struct.pack("<f", 2.0) + bytes([0x07 | (0xE << 4), 0x00])
  assert e.nbytes == 4 + 2


def test_short_last_block_has_its_own_scale():
  x = np.array([1.0, 1.0, 1.0, 1.0, 0.25], np.float32)
  for codec in ("int8", "fp4"):
    np.testing.assert_array_equal(C.decode(C.encode(x, codec, block=4)), x)


@pytest.mark.parametrize("n", [0, 1, 2, 255, 256, 257, 1001])
@pytest.mark.parametrize("codec", C.CODECS)
def test_byte_counts_exact(codec, n):
  e = C.encode(np.ones(n, np.float32), codec)
  assert e.nbytes == C.encoded_nbytes(codec, n)


def test_byte_counts_by_hand():
  # 1001 values, block 256: 4 blocks of scales (16 bytes).
  assert C.encoded_nbytes("fp32", 1001) == 4004
  assert C.encoded_nbytes("bf16", 1001) == 2002
  assert C.encoded_nbytes("int8", 1001) == 16 + 1001
  assert C.encoded_nbytes("fp4", 1001) == 16 + 501
  assert C.encoded_nbytes("fp4", 1001, block=1001) == 4 + 501
  assert all(C.encoded_nbytes(c, 0) == 0 for c in C.CODECS)


@pytest.mark.parametrize("codec", C.CODECS)
def test_shapes_empty_and_scalar(codec):
  for x in (np.zeros((0, 3), np.float32), np.float32(-2.0), np.ones((3, 5, 7), np.float32)):
    y = C.decode(C.encode(x, codec, block=4))
    assert y.shape == np.shape(x) and y.dtype == np.float32
    np.testing.assert_array_equal(y, x)
    y[...] = 1  # writable


@pytest.mark.parametrize("codec", C.CODECS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected(codec, bad):
  x = np.ones(300, np.float32)
  x[299] = bad  # in the short last block
  with pytest.raises(ValueError, match="non-finite"):
    C.encode(x, codec)


def test_float64_overflowing_float32_rejected():
  with pytest.raises(ValueError, match="non-finite"):
    C.encode(np.array([1.0, 1e300]), "int8")


def test_bf16_overflow_rejected():
  bf16_max = np.uint32(0x7F7F0000).view(np.float32)  # (2 - 2^-7)·2^127
  tie = np.uint32(0x7F7F8000).view(np.float32)  # bf16 max + half an ulp: tie to even, Inf
  below = np.uint32(0x7F7F7FFF).view(np.float32)
  with pytest.raises(ValueError, match="bfloat16"):
    C.encode(np.array([1.0, -tie], np.float32), "bf16")
  np.testing.assert_array_equal(
      C.decode(C.encode(np.array([below, -bf16_max]), "bf16")), [bf16_max, -bf16_max]
  )


def test_tiny_blocks_flush_to_zero_within_bound():
  x = np.array([1e-35, -3e-36, 1.0, 0.5], np.float32)
  for codec in ("int8", "fp4"):
    y = C.decode(C.encode(x, codec, block=2))
    np.testing.assert_array_equal(y[:2], 0.0)
    assert (np.abs(y - x) <= C.error_bound(codec, x, 2)).all()


def test_bad_arguments():
  x = np.ones(4, np.float32)
  with pytest.raises(ValueError, match="codec"):
    C.encode(x, "fp8")
  with pytest.raises(ValueError, match="block"):
    C.encode(x, "int8", block=0)
  with pytest.raises(ValueError, match="real numbers"):
    C.encode(np.ones(3, np.complex64), "fp32")
  with pytest.raises(ValueError, match="shape"):
    C.Encoded("fp32", (-1, 2), b"", 4)
  e = C.encode(x, "fp4", block=2)
  with pytest.raises(ValueError, match="corrupt"):
    C.decode(C.Encoded("fp4", e.shape, e.payload[:-1], e.block))


def test_tree_helpers():
  tree = {"a/kernel": _wide_range(300), "b/scale": np.ones((2, 3), np.float32)}
  enc = C.encode_tree(tree, "fp4")
  assert C.tree_nbytes(enc) == C.encoded_nbytes("fp4", 300) + C.encoded_nbytes("fp4", 6)
  dec = C.decode_tree(enc)
  assert dec.keys() == tree.keys()
  np.testing.assert_array_equal(dec["b/scale"], tree["b/scale"])
  err = np.abs(dec["a/kernel"] - tree["a/kernel"])
  assert (err <= C.error_bound("fp4", tree["a/kernel"])).all()


@pytest.mark.parametrize("codec", ["int8", "fp4"])
@pytest.mark.parametrize("n,block", [(1001, 7), (1001, 256), (4096, 256), (9, 4)])
def test_chunks_change_no_byte(monkeypatch, codec, n, block):
  x = _wide_range(n, seed=n) * np.float32(1e-3)
  x[: 2 * block] = 0.0  # a flushed block at the start
  monkeypatch.setattr(blockwise, "CHUNK", 1 << 30)  # the whole array in one chunk
  whole = C.encode(x, codec, block)
  want = C.decode(whole)
  monkeypatch.setattr(blockwise, "CHUNK", 3)  # one block (two for block 1) per chunk, a short tail
  e = C.encode(x, codec, block)
  assert e.payload == whole.payload
  y = C.decode(e)
  assert y.flags.writeable and y.shape == x.shape
  np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
  pieces = [(c0, d.copy()) for c0, d in C.decode_chunks(e)]  # one scratch chunk, reused
  assert len(pieces) > 1 and [c0 for c0, _ in pieces][:2] == [0, pieces[0][1].size]
  np.testing.assert_array_equal(
      np.concatenate([d for _, d in pieces]).view(np.uint32), want.reshape(-1).view(np.uint32)
  )
  x[-1] = np.nan  # in the last chunk: the message counts the whole array
  with pytest.raises(ValueError, match="1 of 1001|1 of 4096|1 of 9"):
    C.encode(x, codec, block)
