"""The outer step's fast path (diloco/outer/codecs/kernels.py) gives the bits of the reference: optax's
step op by op, then the codec's encode and add_decoded. This is the contract between the two."""

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco.outer import optimizers
from diloco.outer.codecs import blockwise, compression, kernels
from diloco.outer.sync import commit


def _passes(tx, g, trace, plus, old):
  """The reference (optax, encode, add_decoded): (encoded, new, raw); the trace goes to trace[1]."""
  state = tx.init({"w": g})
  if trace is not None:
    state = jax.tree.unflatten(jax.tree.structure(state), [trace[0]])
  raw, state = optimizers.reference_step(tx, {"w": g}, state, {"w": old}, {"w": plus})
  if trace is not None:
    trace[1][:] = jax.tree.leaves(state)[0]
  encoded = compression.encode(raw["w"], "fp4")
  new = compression.add_decoded(old, encoded, raw["w"])
  return encoded, new, raw["w"]


def _kernel(tx, g, trace, plus, old, spans=None):
  raw = np.empty_like(g)
  job = kernels.SgdFp4(tx, g, trace, plus, old, raw)
  finite = [job.span(*s) for s in (spans or job.spans())]
  encoded, new = job.result()
  return encoded, new, raw, finite


def _same(a: np.ndarray, b: np.ndarray) -> bool:
  return a.tobytes() == b.tobytes()


def test_every_code_boundary_zero_signs_and_short_blocks():
  # Block 0: max 1, so y = x·√2 and the seven magnitudes' thresholds sit at x = 2^k/√2; values
  # just either side of each, ±0, and a subnormal. Block 1 is all below 2^-100 (decodes as 0).
  # Block 2 is 45 values long (the tensor's tail), odd: the last byte takes a pad nibble.
  edges = [np.float32(2.0**k / np.sqrt(2)) for k in range(-6, 1)]
  below = [np.nextafter(e, np.float32(0)) for e in edges]
  vals = [1.0, -1.0, 0.0, -0.0, 1e-40, -1e-40] + edges + below + [-e for e in edges]
  b0 = np.zeros(256, np.float32)
  b0[: len(vals)] = vals
  b1 = np.full(256, 2.0**-101, np.float32) * np.where(np.arange(256) % 2, 1, -1).astype(np.float32)
  b2 = np.linspace(-3, 2, 45, dtype=np.float32)
  g = np.concatenate([b0, b1, b2])
  tx = optimizers.sgd(1.0)  # raw = -g + plus; plus -0 keeps the chosen values (negated), signs too
  plus, old = np.full_like(g, -0.0), np.arange(g.size, dtype=np.float32)
  want = _passes(tx, g, None, plus, old)
  got = _kernel(tx, g, None, plus, old)
  assert got[0] == want[0]  # the same wire bytes
  assert _same(got[1], want[1]) and _same(got[2], want[2])
  assert got[3] == [True]
  # By hand: raw = -g. Block 0's scale is 1, so y = |raw|·√2. Values 0, 1 (raw -1, +1): y ≥ 1,
  # code 7, nibbles 8|7 and 7, byte 0x7F, decoded ∓1. Values 2, 3 (raw -0, +0): code 0 with the
  # sign kept, byte 0x08, decoded ±0. Block 1 (below 2^-100) has scale 0 and decodes as zeros.
  scales = np.frombuffer(got[0].payload[:12], np.float32)
  assert scales.tolist() == [1.0, 0.0, 3.0]
  body = np.frombuffer(got[0].payload[12:], np.uint8)
  assert body[:2].tolist() == [0x7F, 0x08]
  assert got[1][:4].tolist() == [old[0] - 1, old[1] + 1, old[2], old[3]]
  assert np.all(got[1][256:512] == old[256:512])


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_spans_in_any_order_with_nesterov(momentum):
  rng = np.random.default_rng(3)
  n = 3 * blockwise.chunk_values(256) + 301
  g, plus, old = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
  t_old = rng.standard_normal(n).astype(np.float32)
  tx = optimizers.nesterov(0.7, momentum)
  t_p, t_k = np.empty_like(t_old), np.empty_like(t_old)
  want = _passes(tx, g, (t_old, t_p) if momentum else None, plus, old)
  step = blockwise.chunk_values(256)
  spans = [(c0, min(c0 + step, n)) for c0 in range(0, n, step)][::-1]
  got = _kernel(tx, g, (t_old, t_k) if momentum else None, plus, old, spans)
  assert got[0] == want[0] and _same(got[1], want[1]) and _same(got[2], want[2])
  if momentum:
    assert _same(t_k, t_p)


def test_non_finite_update_and_overflowing_values_are_reported():
  tx = optimizers.sgd(1.0)
  g = np.full(600, -1e-3, np.float32)
  g[300] = np.nan
  got = _kernel(tx, g, None, np.zeros_like(g), np.ones_like(g), [(0, 512), (512, 600)])
  assert got[3] == [None, True]  # the first span holds the NaN; the second is fine
  big = np.full(600, 3.4e38, np.float32)  # old + decoded update overflows float32
  got = _kernel(tx, -big, None, np.zeros_like(g), big, [(0, 600)])
  assert got[3] == [False]


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    data=hnp.arrays(
        np.float32,
        st.integers(1, 700),
        elements=st.floats(-(2.0**100), 2.0**100, width=32, allow_subnormal=True),
    ),
    lr=st.sampled_from([1.0, 0.7, 1e-3]),
)
def test_random_updates_match_the_passes(data, lr):
  tx = optimizers.sgd(lr)
  old = np.flip(data).copy()
  plus = (data * np.float32(1e-3)).astype(np.float32)
  want = _passes(tx, data, None, plus, old)
  got = _kernel(tx, data, None, plus, old)
  assert got[0] == want[0]
  assert _same(got[1], want[1]) and _same(got[2], want[2])


def _same_results(a, b) -> bool:
  """Two `commit.outer_step` results equal bit for bit: values, momentum, residual, wire bytes."""
  leaves = lambda s: [np.asarray(x, np.float32).tobytes() for x in jax.tree.leaves(s)]
  return (
      all(_same(a[0][k], b[0][k]) and _same(a[2][k], b[2][k]) for k in a[0])
      and leaves(a[1]) == leaves(b[1])
      and a[3] == b[3]
  )


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    codec=st.sampled_from(compression.CODECS),
    momentum=st.sampled_from([0.9, 0.0]),
    lr=st.sampled_from([0.7, 1e-3]),
    sizes=st.lists(st.integers(1, 1300), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_the_outer_step_is_the_reference_for_every_codec(codec, momentum, lr, sizes, seed):
  # Two merge rounds, so the second starts from a momentum the first wrote. The fast path never
  # calls optax for SGD; the reference always does.
  rng = np.random.default_rng(seed)
  make = lambda scale: {
      f"t{i}": (rng.standard_normal(n) * scale).astype(np.float32) for i, n in enumerate(sizes)
  }
  tx = optimizers.nesterov(lr, momentum)
  old, residual = make(1.0), make(1e-4)
  state = tx.init(old)
  for _ in range(2):
    merged = make(1e-2)
    want = commit.outer_step(tx, merged, state, old, residual, codec, fast=False)
    with pytest.MonkeyPatch.context() as m:
      m.setattr(optimizers, "reference_step", None)  # calling it would fail
      got = commit.outer_step(tx, merged, state, old, residual, codec)
    assert not isinstance(got, str) and _same_results(got, want)
    old, state, residual = got[0], got[1], got[2]
