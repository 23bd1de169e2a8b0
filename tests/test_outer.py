"""Outer optimizers against hand-computed steps and the Delayed Nesterov formula."""

import jax
import numpy as np
import optax
import pytest

from diloco.outer import optimizers
from diloco.outer.codecs import kernels

LR, BETA = 0.7, 0.9


def _run(tx, theta0: float, grads) -> list[float]:
  """θ after each outer gradient, for a one-leaf path-keyed dict."""
  params = {"blocks/0/w": np.array([theta0], np.float32)}
  state = tx.init(params)
  out = []
  for g in grads:
    updates, state = tx.update({"blocks/0/w": np.array([g], np.float32)}, state, params)
    params = optax.apply_updates(params, updates)
    out.append(float(params["blocks/0/w"][0]))
  return out


def _delayed_reference(theta, grads, lr, beta, n, c):
  """DESIGN.md 3.4 written out in plain floats."""
  m = acc = 0.0
  out = []
  for t, g in enumerate(grads, start=1):
    acc += g
    if t % n == 0:
      m = beta * m + acc / n
      theta -= lr * ((1 - c * n + c) * beta * m + g / n)
      acc = 0.0
    else:
      theta -= lr * (c * beta * m + g / n)
    out.append(theta)
  return out


def test_nesterov_steps_by_hand():
  # Step 1: m = 0.5, θ = 1 − 0.7·(0.5 + 0.9·0.5) = 0.335.
  # Step 2: m = 0.5 + 0.9·0.5 = 0.95, θ = 0.335 − 0.7·(0.5 + 0.9·0.95) = −0.6135.
  got = _run(optimizers.nesterov(LR, BETA), 1.0, [0.5, 0.5])
  np.testing.assert_allclose(got, [0.335, -0.6135], rtol=1e-6)


def test_zero_momentum_is_plain_sgd():
  got = _run(optimizers.nesterov(LR, 0.0), 1.0, [0.5, 0.5])
  np.testing.assert_allclose(got, [0.65, 0.3], rtol=1e-6)
  np.testing.assert_allclose(_run(optimizers.make_outer("sgd"), 1.0, [0.25]), [0.75], rtol=1e-6)


@pytest.mark.parametrize(
    "c,want",
    [
        # N=2, grads 1, 2, 3, 4 from θ=0, worked by hand:
        # c=0:   −0.35, −0.35 − 0.7·(0.9·1.5 + 1) = −1.995, −1.995 − 0.7·1.5 = −3.045,
        #        m = 0.9·1.5 + 7/2 = 4.85: −3.045 − 0.7·(0.9·4.85 + 2) = −7.5005.
        (0.0, [-0.35, -1.995, -3.045, -7.5005]),
        # c=0.5: 1 − cN + c = 0.5: −0.35, −0.35 − 0.7·(0.5·0.9·1.5 + 1) = −1.5225,
        #        −1.5225 − 0.7·(0.5·0.9·1.5 + 1.5) = −3.045, −3.045 − 0.7·(0.5·0.9·4.85 + 2) = −5.97275.
        (0.5, [-0.35, -1.5225, -3.045, -5.97275]),
    ],
)
def test_delayed_nesterov_by_hand(c, want):
  got = _run(optimizers.delayed_nesterov(LR, BETA, period=2, c=c), 0.0, [1.0, 2.0, 3.0, 4.0])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  reference = _delayed_reference(0.0, [1.0, 2.0, 3.0, 4.0], LR, BETA, 2, c)
  np.testing.assert_allclose(reference, want, rtol=1e-12)


@pytest.mark.parametrize("n,c", [(2, 0.0), (2, 0.5), (3, 0.25), (4, 1.0)])
def test_delayed_nesterov_matches_formula_step_by_step(n, c):
  grads = list(np.random.default_rng(n).standard_normal(11))
  got = _run(optimizers.delayed_nesterov(LR, BETA, n, c), 0.3, grads)
  want = _delayed_reference(0.3, grads, LR, BETA, n, c)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_delayed_nesterov_period_one_is_nesterov():
  grads = list(np.random.default_rng(0).standard_normal(7))
  np.testing.assert_allclose(
      _run(optimizers.delayed_nesterov(LR, BETA, 1), 0.0, grads),
      _run(optimizers.nesterov(LR, BETA), 0.0, grads),
      rtol=1e-5,
      atol=1e-6,
  )


def test_four_identical_gradients_overshoot_vs_delayed():
  # Nesterov one at a time: ε(4 + 4β + 3β² + 2β³ + β⁴)g = 0.7·12.1441 = 8.50087.
  # Delayed, N=4, c=0: three SGD steps of εg/4, then m = g: ε(g/4 + βg), total ε(1 + β)g = 1.33.
  nest = _run(optimizers.nesterov(LR, BETA), 0.0, [1.0] * 4)[-1]
  overshoot = 4 + 4 * BETA + 3 * BETA**2 + 2 * BETA**3 + BETA**4
  assert nest == pytest.approx(-LR * overshoot, rel=1e-6)
  assert nest == pytest.approx(-8.50087, rel=1e-6)
  delayed = _run(optimizers.delayed_nesterov(LR, BETA, 4), 0.0, [1.0] * 4)[-1]
  assert delayed == pytest.approx(-1.33, rel=1e-6)


def test_delayed_nesterov_on_a_tree_and_under_jit():
  tx = optimizers.make_outer("delayed_nesterov", lr=LR, momentum=BETA, period=2, c=0.5)
  params = {"a/w": np.ones((2, 3), np.float32), "b/scale": np.zeros(3, np.float32)}
  g = {"a/w": np.full((2, 3), 0.5, np.float32), "b/scale": np.ones(3, np.float32)}
  state = tx.init(params)
  jit_update = jax.jit(tx.update)
  s_eager, s_jit = state, state
  for _ in range(3):
    u_eager, s_eager = tx.update(g, s_eager)
    u_jit, s_jit = jit_update(g, s_jit)
    for k in params:
      np.testing.assert_allclose(u_jit[k], u_eager[k], rtol=1e-6)
      assert u_eager[k].dtype == np.float32 and u_eager[k].shape == params[k].shape
  # Three identical gradients g, N=2, c=0.5: −ε·[g/2, 0.5β(g) + g/2, 0.5β(g) + g/2] in total.
  want = -LR * (0.5 + 2 * (0.5 * BETA + 0.5))
  theta = _run(tx, 0.0, [1.0] * 3)[-1]
  assert theta == pytest.approx(want, rel=1e-6)
  assert int(s_eager.count) == 3


def test_make_outer_and_errors():
  assert _run(optimizers.make_outer("nesterov"), 1.0, [0.5]) == pytest.approx([0.335])
  with pytest.raises(ValueError, match="unknown outer optimizer"):
    optimizers.make_outer("adam")
  with pytest.raises(ValueError, match="bad arguments"):
    optimizers.make_outer("nesterov", period=3)
  with pytest.raises(ValueError, match="learning rate"):
    optimizers.nesterov(lr=0.0)
  with pytest.raises(ValueError, match="momentum"):
    optimizers.nesterov(momentum=1.0)
  with pytest.raises(ValueError, match="period"):
    optimizers.delayed_nesterov(LR, BETA, 0)
  with pytest.raises(ValueError, match="c must"):
    optimizers.delayed_nesterov(LR, BETA, 2, c=1.5)


def _tree(rng, scale: float, shapes=((300, 7), (5,), (2, 3))) -> dict[str, np.ndarray]:
  return {
      f"blocks/{i}/w": (rng.standard_normal(s) * scale).astype(np.float32)
      for i, s in enumerate(shapes)
  }


@pytest.mark.parametrize("momentum", [BETA, 0.0])
def test_host_step_is_bit_identical_to_optax_op_by_op(monkeypatch, momentum):
  monkeypatch.setattr(kernels, "CHUNK", 64)  # many chunks and a short last one
  tx = optimizers.nesterov(LR, momentum)
  rng = np.random.default_rng(0)
  params = _tree(rng, 1.0)
  state_optax = state_host = tx.init(params)
  for _ in range(3):  # the momentum buffers carry over
    grads, plus = _tree(rng, 1e-2), _tree(rng, 1e-4)
    updates, state_optax = tx.update(grads, state_optax, params)
    got, state_host = optimizers.host_step(tx, grads, state_host, params, plus)
    for k in params:
      want = np.asarray(updates[k], np.float32) + plus[k]
      assert got[k].dtype == np.float32 and got[k].shape == params[k].shape
      np.testing.assert_array_equal(got[k].view(np.uint32), want.view(np.uint32))
  assert jax.tree.structure(state_host) == jax.tree.structure(state_optax)
  for a, b in zip(jax.tree.leaves(state_host), jax.tree.leaves(state_optax)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def test_host_step_by_hand_and_in_place():
  # m = 0.5 + 0.9·1 = 1.4; update = −0.7·(0.5 + 0.9·1.4) = −1.232; plus 0.25: −0.982.
  tx = optimizers.nesterov(LR, BETA)
  params = {"w": np.zeros(2, np.float32)}
  treedef = jax.tree.structure(tx.init(params))
  state = jax.tree.unflatten(treedef, [np.ones(2, np.float32)])
  buffer = jax.tree.leaves(state)[0]
  got, state = optimizers.host_step(
      tx, {"w": np.full(2, 0.5, np.float32)}, state, params, {"w": np.full(2, 0.25, np.float32)}
  )
  np.testing.assert_allclose(got["w"], [-0.982, -0.982], rtol=1e-6)
  assert jax.tree.leaves(state)[0] is buffer  # a writable numpy buffer is updated in place
  np.testing.assert_allclose(buffer, [1.4, 1.4], rtol=1e-6)


def test_host_step_runs_other_transformations_through_optax():
  tx = optimizers.delayed_nesterov(LR, BETA, 2)
  params = {"w": np.zeros(1, np.float32)}
  # Step 1 of N=2 with c=0: −0.7·(1/2) = −0.35, plus 1.
  got, state = optimizers.host_step(
      tx, {"w": np.ones(1, np.float32)}, tx.init(params), params, {"w": np.ones(1, np.float32)}
  )
  np.testing.assert_allclose(got["w"], [0.65], rtol=1e-6)
  assert int(state.count) == 1
