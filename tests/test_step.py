"""The sharded, pure train step: golden numbers, shardings, and the inner optimizer."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from diloco.config import variants
from diloco.inner import sharding, step as step_lib
from diloco.models import transformer as tr

TINY = tr.ModelConfig(**variants.MODEL_SIZES["tiny"])
OPT = step_lib.OptimizerConfig(lr=1e-2, warmup_steps=0, decay_steps=0)


def _batch(b=8, l=32, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, 256, (b, l + 1)).astype(np.int32)
  return {"inputs_BxL": tokens[:, :-1], "targets_BxL": tokens[:, 1:]}


def _fns(data, fsdp, opt=OPT):
  mesh = sharding.make_island_mesh(jax.devices()[: data * fsdp], data=data, fsdp=fsdp)
  return step_lib.build_step_fns(TINY, opt, mesh)


def test_golden_loss_after_one_step():
  # Pinned from a run of this implementation (tiny model, seed 0, AdamW lr 1e-2, no warmup,
  # clip 1). The loss before the step is near ln 256 + 0.5 = 6.045 (unit-variance logits, see
  # test_model.py); after one step on the same batch it must drop. Any change to init, model or optimizer
  # numerics moves these values.
  fns = _fns(1, 1)
  state = fns.init(jax.random.key(0))
  batch = step_lib.put_batch(_batch(), fns.mesh)
  state, m = fns.train(state, batch)
  after = float(fns.eval(state.params, batch))
  assert float(m["loss"]) == pytest.approx(GOLDEN_BEFORE, rel=1e-5)
  assert after == pytest.approx(GOLDEN_AFTER, rel=1e-5)
  assert after < float(m["loss"])
  assert int(state.step) == 1


GOLDEN_BEFORE = 5.9989734
GOLDEN_AFTER = 4.9621892


@pytest.mark.parametrize("data,fsdp", [(2, 4), (4, 2)])
def test_shardings_follow_the_rules_on_8_devices(data, fsdp):
  fns = _fns(data, fsdp)
  state = fns.init(jax.random.key(0))
  specs = jax.tree.map(lambda x: x.sharding.spec, state.params)
  assert specs["embed"]["embedding"] == P("fsdp", None)
  assert specs["blocks"][0]["attn"]["qkv"] == P("fsdp", None, None, None)
  assert specs["blocks"][1]["attn"]["out"] == P(None, None, "fsdp")
  assert specs["blocks"][0]["mlp"]["wi"] == P("fsdp", None, None)  # [D, 2, F]: embed, -, mlp
  assert specs["blocks"][0]["mlp"]["wo"] == P(None, "fsdp")
  assert specs["final_norm"]["scale"] == P()
  # Adam moments follow their parameters.
  mu = state.opt_state[1][0].mu
  assert mu["blocks"][0]["attn"]["qkv"].sharding.spec == P("fsdp", None, None, None)
  # Each device holds 1/fsdp of a sharded matrix.
  qkv = state.params["blocks"][0]["attn"]["qkv"]
  assert qkv.addressable_shards[0].data.shape == (32 // fsdp, 3, 2, 16)
  batch = step_lib.put_batch(_batch(), fns.mesh)
  assert batch["inputs_BxL"].sharding.spec == P(("data", "fsdp"), None)
  assert batch["inputs_BxL"].addressable_shards[0].data.shape == (1, 32)
  state, m = fns.train(state, batch)
  assert state.params["blocks"][0]["attn"]["qkv"].sharding.spec == P("fsdp", None, None, None)


def test_sharded_step_matches_single_device():
  # SGD, so the comparison is not dominated by Adam's sign-like updates of near-zero gradients.
  sgd = step_lib.OptimizerConfig(name="sgd", lr=0.5, warmup_steps=0, decay_steps=0)
  one, eight = _fns(1, 1, sgd), _fns(2, 4, sgd)
  s1, s8 = one.init(jax.random.key(0)), eight.init(jax.random.key(0))
  for i in range(3):
    s1, m1 = one.train(s1, step_lib.put_batch(_batch(seed=i), one.mesh))
    s8, m8 = eight.train(s8, step_lib.put_batch(_batch(seed=i), eight.mesh))
  np.testing.assert_allclose(float(m1["loss"]), float(m8["loss"]), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), s1.params, s8.params)


def test_mesh_that_does_not_tile_is_rejected():
  with pytest.raises(ValueError, match="does not tile"):
    sharding.make_island_mesh(jax.devices()[:8], data=3, fsdp=2)


def test_fsdp_that_does_not_divide_a_weight_is_rejected():
  mesh = sharding.make_island_mesh(jax.devices()[:6], data=1, fsdp=6)
  with pytest.raises(ValueError, match="not divisible"):
    step_lib.build_step_fns(TINY, OPT, mesh)


def test_sgd_inner_step_is_params_minus_lr_times_grad():
  opt = step_lib.OptimizerConfig(name="sgd", lr=0.5, warmup_steps=0, decay_steps=0, clip_norm=0)
  fns = _fns(1, 1, opt)
  state = fns.init(jax.random.key(0))
  batch = step_lib.put_batch(_batch(), fns.mesh)
  grads = jax.grad(fns.eval)(state.params, batch)
  expected = jax.tree.map(lambda p, g: p - 0.5 * g, state.params, grads)
  new, _ = fns.train(jax.tree.map(lambda x: x.copy(), state), batch)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), new.params, expected)


def test_lr_schedule_warmup_then_cosine():
  cfg = step_lib.OptimizerConfig(lr=1.0, warmup_steps=10, decay_steps=100, min_lr_ratio=0.1)
  s = step_lib.lr_schedule(cfg)
  assert float(s(0)) == 0.0
  assert float(s(5)) == pytest.approx(0.5)
  assert float(s(10)) == pytest.approx(1.0)
  assert float(s(60)) == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-5)  # half-way down the cosine
  assert float(s(110)) == pytest.approx(0.1, rel=1e-5)


def test_unknown_optimizer_is_rejected():
  with pytest.raises(ValueError, match="unknown inner optimizer"):
    step_lib.make_optimizer(step_lib.OptimizerConfig(name="lion"))
