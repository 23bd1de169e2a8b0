"""Token weights, weighted mean and radial-directional averaging, against hand-computed values."""

import math

import numpy as np
import pytest

from diloco.outer import merging as M

R2 = math.sqrt(2)


def test_token_weights_by_hand():
  # w = tokens·(tokens/steps): 100·10, 200·20; the idle learner gets 0.
  np.testing.assert_array_equal(M.token_weights([100, 200, 0], [10, 10, 0]), [1000, 4000, 0])
  # Same tokens in fewer (larger) steps counts more: 300·100 vs 300·50.
  np.testing.assert_array_equal(M.token_weights([300, 300], [3, 6]), [30000.0, 15000.0])


def test_token_weights_errors():
  with pytest.raises(ValueError, match="zero steps"):
    M.token_weights([5, 1], [0, 1])
  with pytest.raises(ValueError, match=">= 0"):
    M.token_weights([-1], [1])
  with pytest.raises(ValueError, match="equal length"):
    M.token_weights([1, 2], [1])


def test_equal_weights():
  np.testing.assert_array_equal(M.equal_weights(4), [0.25] * 4)
  with pytest.raises(ValueError, match="at least one"):
    M.equal_weights(0)


def test_weighted_mean_by_hand():
  a = np.array([1.0, 2.0], np.float32)
  b = np.array([3.0, 6.0], np.float32)
  np.testing.assert_array_equal(M.weighted_mean([a, b], [1, 3]), [2.5, 5.0])  # (1·a + 3·b)/4
  np.testing.assert_array_equal(M.weighted_mean([a, b], [2, 0]), a)
  out = M.weighted_mean([a.reshape(2, 1)], [7])
  assert out.shape == (2, 1) and out.dtype == np.float32


def test_weighted_mean_errors():
  a = np.zeros(2, np.float32)
  with pytest.raises(ValueError, match="all weights are zero"):
    M.weighted_mean([a, a], [0, 0])
  with pytest.raises(ValueError, match=">= 0"):
    M.weighted_mean([a, a], [1, -1])
  with pytest.raises(ValueError, match="need 2 weights"):
    M.weighted_mean([a, a], [1])
  with pytest.raises(ValueError, match="shape"):
    M.weighted_mean([a, np.zeros(3, np.float32)], [1, 1])
  with pytest.raises(ValueError, match="at least one"):
    M.weighted_mean([], [])


def _rda_reference(deltas, weights):
  """Float64 RDA straight from the definition."""
  w = np.asarray(weights, np.float64)
  d = [np.asarray(x, np.float64) for x in deltas]
  n = [np.linalg.norm(x) for x in d]
  target = sum(wi * ni for wi, ni in zip(w, n)) / w.sum()
  u = sum(wi * x / ni for wi, x, ni in zip(w, d, n) if ni > 0)
  return target * u / np.linalg.norm(u)


def test_chunked_matches_float64_reference(monkeypatch):
  monkeypatch.setattr(M, "CHUNK", 7)  # many chunks and a short last one
  rng = np.random.default_rng(0)
  deltas = [rng.standard_normal((5, 9)).astype(np.float32) * s for s in (1.0, 0.1, 3.0)]
  w = [1.0, 2.0, 0.5]
  want_mean = sum(wi * x.astype(np.float64) for wi, x in zip(w, deltas)) / sum(w)
  np.testing.assert_allclose(M.weighted_mean(deltas, w), want_mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(M.rda(deltas, w), _rda_reference(deltas, w), rtol=1e-5, atol=1e-6)


def test_rda_orthogonal_unit_vectors_keep_norm():
  e1, e2 = np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)
  merged = M.rda([e1, e2], M.equal_weights(2))
  np.testing.assert_allclose(merged, [1 / R2, 1 / R2], rtol=1e-6)
  assert np.linalg.norm(merged) == pytest.approx(1.0, rel=1e-6)
  assert np.linalg.norm(M.weighted_mean([e1, e2], M.equal_weights(2))) == pytest.approx(1 / R2)


def test_rda_parallel_vectors_equal_mean():
  a = np.array([1.0, 2.0], np.float32)
  # norms √5 and 2√5: mean norm 1.5√5 along [1, 2]/√5, i.e. [1.5, 3], the plain mean.
  np.testing.assert_allclose(M.rda([a, 2 * a], [1, 1]), [1.5, 3.0], rtol=1e-6)
  np.testing.assert_allclose(M.weighted_mean([a, 2 * a], [1, 1]), [1.5, 3.0], rtol=1e-6)


def test_rda_zero_delta_adds_norm_zero_and_no_direction():
  a, z = np.array([3.0, 4.0], np.float32), np.zeros(2, np.float32)
  # norm (5 + 0)/2 = 2.5 along [0.6, 0.8].
  np.testing.assert_allclose(M.rda([a, z], [1, 1]), [1.5, 2.0], rtol=1e-6)
  np.testing.assert_array_equal(M.rda([z, z], [1, 1]), [0.0, 0.0])
  # Opposite unit vectors: the direction sums to zero, normalize(0) = 0.
  e1 = np.array([1.0, 0.0], np.float32)
  np.testing.assert_array_equal(M.rda([e1, -e1], [1, 1]), [0.0, 0.0])


def test_rda_unequal_weights_by_hand():
  a, b = np.array([2.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)
  # norm (3·2 + 1·1)/4 = 7/4, direction (3, 1)/√10.
  want = 7 / 4 * np.array([3.0, 1.0]) / math.sqrt(10)
  np.testing.assert_allclose(M.rda([a, b], [3, 1]), want, rtol=1e-6)


def test_rda_extreme_scales():
  a = np.array([1e-40, 0.0], np.float32)  # subnormal: its square underflows in float32
  b = np.array([0.0, 1e30], np.float32)
  target = (1e-40 + 1e30) / 2
  np.testing.assert_allclose(M.rda([a, b], [1, 1]), [target / R2, target / R2], rtol=1e-5)


def _fragment(x, y):
  return {"embed/embedding": np.array(x, np.float32), "blocks/0/w": np.array(y, np.float32)}


def test_merge_fragment_embedding_by_mean():
  deltas = [_fragment([1, 0], [1, 0]), _fragment([0, 1], [0, 1])]
  merged = M.merge_fragment(deltas, [1, 1], rule="rda")
  assert list(merged) == ["blocks/0/w", "embed/embedding"]
  np.testing.assert_allclose(merged["embed/embedding"], [0.5, 0.5])
  np.testing.assert_allclose(merged["blocks/0/w"], [1 / R2, 1 / R2], rtol=1e-6)
  by_mean = M.merge_fragment(deltas, [1, 1], rule="mean")
  np.testing.assert_allclose(by_mean["blocks/0/w"], [0.5, 0.5])
  nothing_embedded = M.merge_fragment(deltas, [1, 1], rule="rda", is_embedding=lambda p: False)
  np.testing.assert_allclose(nothing_embedded["embed/embedding"], [1 / R2, 1 / R2], rtol=1e-6)


def test_merge_fragment_errors():
  a = _fragment([1, 0], [1, 0])
  with pytest.raises(ValueError, match="missing"):
    M.merge_fragment([a, {"blocks/0/w": a["blocks/0/w"]}], [1, 1])
  with pytest.raises(ValueError, match="rule"):
    M.merge_fragment([a], [1], rule="median")
  with pytest.raises(ValueError, match="need 2 weights"):
    M.merge_fragment([a, a], [1])


@pytest.mark.parametrize("rule", M.RULES)
def test_merge_checked_names_the_non_finite_deltas(monkeypatch, rule):
  monkeypatch.setattr(M, "CHUNK", 3)
  good = [_fragment([1, 0], [0.5, 0.25]), _fragment([0, 2], [0.25, 1])]
  nan = _fragment([1, 0], [np.nan, 0])  # bad only in a leaf merged by `rule`
  inf = _fragment([0, -np.inf], [1, 0])  # bad only in the embedding (always a mean)
  merged, bad = M.merge_checked(good, [1, 3], rule=rule)
  assert bad == []
  for k, x in M.merge_fragment(good, [1, 3], rule=rule).items():
    np.testing.assert_array_equal(merged[k], x)
  assert M.merge_checked([good[0], nan, good[1], inf], [1, 1, 1, 1], rule=rule)[1] == [1, 3]
  # A zero-weight delta does not take part, but it is still checked.
  assert M.merge_checked([good[0], nan], [1, 0], rule=rule)[1] == [1]


def test_merge_checked_when_rda_directions_cancel_around_a_nan():
  # The NaN delta's norm is NaN and it is left out of the direction sum; the others cancel
  # exactly, so RDA's result is 0, finite: the norm still names the NaN delta.
  x = _fragment([1, 1], [1, -2])
  minus = {k: -v for k, v in x.items()}
  nan = _fragment([0, 0], [np.nan, 1])
  merged, bad = M.merge_checked([x, nan, minus], [1, 1, 1], rule="rda")
  np.testing.assert_array_equal(merged["blocks/0/w"], [0.0, 0.0])
  assert bad == [1]


def test_merge_checked_overflow_of_finite_deltas_is_not_blamed_on_them():
  # Ten tenths of float32's largest value, each product and sum rounded to float32, end past it
  # (0.1 rounds up in float32): the mean is Inf, but every delta is finite and none is named.
  top = np.finfo(np.float32).max
  with np.errstate(over="ignore"):
    merged, bad = M.merge_checked([_fragment([1, 0], [top, 0])] * 10, [1] * 10, rule="mean")
  assert bad == [] and merged["blocks/0/w"][0] == np.inf


def test_equal_weights_sum_then_scale_and_redo_a_chunk_that_overflows(monkeypatch):
  monkeypatch.setattr(M, "CHUNK", 4)
  rng = np.random.default_rng(3)
  deltas = [rng.standard_normal(10).astype(np.float32) for _ in range(3)]
  third = np.float32(1 / 3)
  big = np.float32(3e38)  # 3e38 + 3e38 overflows, 3e38/2 + 3e38/2 does not
  deltas[0][5] = deltas[1][5] = big
  got = M.weighted_mean(deltas, [1, 1, 1])
  with np.errstate(over="ignore"):
    want = (deltas[0] + deltas[1] + deltas[2]) * third  # w·Σx, in float32
  chunk = slice(4, 8)  # the chunk holding the big values is done as Σ w·x instead
  want[chunk] = (deltas[0][chunk] * third + deltas[1][chunk] * third) + deltas[2][chunk] * third
  assert np.isfinite(want).all()
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
