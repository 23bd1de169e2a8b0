"""recipe=charles2025, the inner optimizer and model of the DiLoCo scaling laws (Charles et al.
2025): each part pinned to numbers worked out by hand, and the defaults left as they were."""

import math
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import digits, shakespeare
from diloco.config import checks, resolve, variants
from diloco.inner import island, step as step_lib
from diloco.models import transformer as tr, vit

REPO = __file__.rsplit("/tests/", 1)[0]
TINY = {**variants.MODEL_SIZES["tiny"], "vocab_size": 256}


def _recipe(arg: str = ""):
  return shakespeare.get_config(",".join(filter(None, ["recipe=charles2025", arg])))


def test_the_defaults_are_unchanged():
  c = shakespeare.get_config()
  o = c.optimizer
  assert (c.recipe, o.b2, o.min_lr_ratio, o.weight_decay) == ("none", 0.95, 0.1, 0.1)
  assert (o.weight_decay_kind, o.weight_decay_time_constant) == ("coupled", 0)
  assert (c.model.qk_norm, c.model.z_loss) == (False, 0.0)
  assert island.optimizer_config(c).optax_weight_decay() == 0.1
  cfg = tr.ModelConfig()
  assert (cfg.qk_norm, cfg.z_loss) == (False, 0.0)


def test_the_recipe_fills_its_keys_and_an_explicit_value_wins():
  c = _recipe()
  o = c.optimizer
  assert (o.b2, o.min_lr_ratio, o.weight_decay_kind) == (0.99, 0.05, "independent")
  assert o.weight_decay_time_constant == c.steps == 300
  assert (c.model.qk_norm, c.model.z_loss) == (True, 1e-4)
  c.optimizer.b2, c.model.z_loss = 0.98, 0.0  # explicit, as a --config flag
  resolve.resolve(c)
  assert (c.optimizer.b2, c.model.z_loss, c.model.qk_norm) == (0.98, 0.0, True)
  data = types.SimpleNamespace(image_shape=None, vocab_size=256)
  cfg = island.model_config(_recipe(), data)  # the model keys reach the transformer
  assert (cfg.qk_norm, cfg.z_loss) == (True, 1e-4)


def test_adamw_b2_reaches_the_optimizer():
  # One step with gradient 2 everywhere: nu = (1 - b2) * g^2 = 0.01 * 4 = 0.04.
  opt = step_lib.OptimizerConfig(b2=0.99, warmup_steps=0, decay_steps=0, clip_norm=0.0)
  tx = step_lib.make_optimizer(opt)
  params = {"w": jnp.ones((2, 2))}
  _, state = tx.update({"w": jnp.full((2, 2), 2.0)}, tx.init(params), params)
  (nu,) = optax.tree_utils.tree_get_all_with_path(state, "nu")
  np.testing.assert_allclose(nu[1]["w"], 0.04, rtol=1e-6)


def test_warmup_then_cosine_to_five_percent_of_the_peak_at_the_end_of_the_run():
  c = _recipe()
  assert c.optimizer.decay_steps == 280  # steps - warmup_steps, derived
  lr = step_lib.lr_schedule(island.optimizer_config(c))
  peak, floor = 1e-2, 5e-4  # 5% of the peak
  assert float(lr(0)) == 0.0
  assert float(lr(10)) == pytest.approx(5e-3, rel=1e-6)  # half way through warmup
  assert float(lr(20)) == pytest.approx(peak, rel=1e-6)  # warmup's end
  # the middle of the cosine (step 20 + 140): floor + (peak - floor) / 2
  assert float(lr(160)) == pytest.approx(5.25e-3, rel=1e-6)
  # the last update (step 299) is (peak - floor) * (1 - cos(pi/280)) / 2 = 2.99e-7 above the
  # floor; the floor itself is the rate of step 300 = steps, and it holds after
  assert float(lr(299)) == pytest.approx(floor + 2.9898e-7, rel=1e-5)
  assert float(lr(300)) == pytest.approx(floor, rel=1e-6)
  assert float(lr(1000)) == pytest.approx(floor, rel=1e-6)
  longer = _recipe("steps=1000")  # the schedule follows steps
  assert longer.optimizer.decay_steps == 980
  assert float(step_lib.lr_schedule(island.optimizer_config(longer))(1000)) == pytest.approx(floor)


def test_independent_weight_decay_shrinks_a_matrix_by_one_over_t_per_step_at_the_peak():
  # Zero gradients: Adam's update is 0/(0 + eps) = 0, so one step at the peak lr leaves
  # w - lr * (1/(T*lr)) * w = w * (1 - 1/T): 3 * 299/300 = 2.99. Vectors (norm scales) do not decay.
  t = 300
  opt = step_lib.OptimizerConfig(
      lr=1e-2,
      warmup_steps=0,
      decay_steps=t,
      weight_decay_kind="independent",
      weight_decay_time_constant=t,
  )
  assert opt.optax_weight_decay() == pytest.approx(1 / 3)  # 1 / (300 * 0.01)
  tx = step_lib.make_optimizer(opt)
  params = {"w": jnp.full((2, 3), 3.0), "scale": jnp.full((3,), 3.0)}
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_allclose(new["w"], 2.99, rtol=1e-6)
  np.testing.assert_array_equal(new["scale"], 3.0)
  # coupled (the default): w * (1 - lr * weight_decay) = 3 * (1 - 0.01 * 0.1) = 2.997
  tx = step_lib.make_optimizer(step_lib.OptimizerConfig(lr=1e-2, warmup_steps=0, decay_steps=t))
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(optax.apply_updates(params, updates)["w"], 2.997, rtol=1e-6)


def test_the_time_constant_is_the_run_length_and_the_listing_shows_it():
  c = shakespeare.get_config()
  c.optimizer.weight_decay_kind = "independent"  # without the recipe: T follows steps too
  c.steps = 500
  resolve.resolve(c)
  assert c.optimizer.weight_decay_time_constant == 500
  assert island.optimizer_config(c).optax_weight_decay() == pytest.approx(1 / (500 * 1e-2))
  out = subprocess.run(
      [
          sys.executable,
          "-m",
          "experiments.config",
          "--config=configs/shakespeare.py:recipe=charles2025",
          "--config.steps=1000",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      check=True,
  ).stdout
  line = next(l for l in out.splitlines() if l.startswith("optimizer.weight_decay_time_constant "))
  assert "= 1000" in line and "[preset]" in line and "1/(T x lr)" in line


def test_bad_recipe_values_are_refused_naming_the_key():
  with pytest.raises(ValueError, match="recipe='bogus': unknown recipe"):
    shakespeare.get_config("recipe=bogus")
  c = shakespeare.get_config()
  c.model.z_loss, c.optimizer.weight_decay_kind = -1.0, "lambda"
  with pytest.raises(checks.ConfigError) as e:
    checks.prepare(c)
  assert "model.z_loss=-1.0: must be >= 0" in str(e.value)
  assert "optimizer.weight_decay_kind='lambda': expected coupled or independent" in str(e.value)
  c = shakespeare.get_config()
  c.optimizer.weight_decay_time_constant = 100  # coupled: would change nothing
  with pytest.raises(checks.ConfigError, match="weight_decay_time_constant=100: only used with"):
    checks.prepare(c)
  c = _recipe()
  c.optimizer.weight_decay_time_constant = 0
  with pytest.raises(checks.ConfigError, match="needs T >= 1 steps"):
    checks.prepare(c)
  with pytest.raises(checks.ConfigError, match="model.z_loss=0.0001: the ViT's objective"):
    checks.prepare(digits.get_config("recipe=charles2025"))
  checks.prepare(_recipe("runlocal,mode=compare"))  # every compared run takes the recipe


@nnx.jit
def _logits(model, tokens):
  return model(tokens)


def _model(**kw) -> tuple[tr.Transformer, jax.Array]:
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
  return tr.ModelConfig(**{**TINY, **kw}).build(nnx.Rngs(0)), tokens


def _scale_qk(model, factor: float):
  """The same model with every block's query and key projections times `factor`."""
  graphdef, state = nnx.split(model)
  params = nnx.to_pure_dict(state)
  for block in params["blocks"].values():
    block["attn"]["qkv"] = block["attn"]["qkv"].at[:, :2].multiply(factor)
  return nnx.merge(graphdef, params)


def test_qk_norm_adds_a_scale_per_head_dim_and_changes_the_logits():
  plain, tokens = _model()
  normed, _ = _model(qk_norm=True)
  attn = nnx.to_pure_dict(nnx.state(normed))["blocks"][0]["attn"]
  assert attn["q_norm"]["scale"].shape == attn["k_norm"]["scale"].shape == (16,)  # Dh = 32/2
  assert "q_norm" not in nnx.to_pure_dict(nnx.state(plain))["blocks"][0]["attn"]
  assert not np.allclose(_logits(plain, tokens), _logits(normed, tokens), atol=1e-3)


def test_qk_norm_is_scale_invariant_and_bounds_the_attention_logits():
  # RMSNorm(10 q) = RMSNorm(q): scaling the query and key projections changes nothing with
  # qk_norm, and changes the logits without it.
  for qk_norm in (True, False):
    model, tokens = _model(qk_norm=qk_norm)
    scaled = _logits(_scale_qk(model, 10.0), tokens)
    same = np.allclose(_logits(model, tokens), scaled, rtol=1e-4, atol=1e-4)
    assert same == qk_norm
  # Each normed head vector has norm sqrt(Dh) (rotary keeps norms), so |q.k| / sqrt(Dh) is at
  # most sqrt(Dh) = 4 with unit scales, however large the projections grow.
  for qk_norm, bounded in ((True, True), (False, False)):
    model, tokens = _model(qk_norm=qk_norm)
    model = _scale_qk(model, 1000.0)
    x = model.blocks[0].attn_norm(model.embed(tokens))
    q, k, _ = model.blocks[0].attn.queries_keys_values(x)
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k) / 4.0
    assert (float(jnp.max(jnp.abs(logits))) <= 4.0 * (1 + 1e-5)) == bounded


def test_qk_norm_in_the_vit_and_the_mixture_of_experts():
  cfg = vit.VitConfig(**{**variants.VIT_SIZES["vit_tiny"], "qk_norm": True})
  images = jnp.ones((2, 8, 8, 1))
  assert _logits(cfg.build(nnx.Rngs(0)), images).shape == (2, 10)
  moe = tr.ModelConfig(**{**variants.model_config("moe_tiny").to_dict(), "qk_norm": True})
  forward = nnx.jit(lambda m, t: m.forward(t))
  logits, aux = forward(moe.build(nnx.Rngs(0)), jnp.zeros((1, 8), jnp.int32))
  assert logits.shape == (1, 8, 256) and "moe_load_balance" in aux


def test_output_z_loss_by_hand():
  # Rows [0, 0] and [ln 3, 0]: log Z = ln 2 and ln 4 = 2 ln 2; mean of squares 2.5 (ln 2)^2.
  logits = jnp.array([[[0.0, 0.0], [math.log(3.0), 0.0]]])
  assert float(tr.output_z_loss(logits)) == pytest.approx(2.5 * math.log(2.0) ** 2, rel=1e-6)


def test_the_z_loss_is_in_the_objective_and_its_metrics_not_in_evaluation():
  plain, tokens = _model()
  with_z, _ = _model(z_loss=1e-4)
  batch = {"inputs_BxL": tokens[:, :-1], "targets_BxL": tokens[:, 1:]}
  objective = nnx.jit(lambda m, b: m.objective(b))
  total, parts = objective(plain, batch)
  assert "z_loss" not in parts and float(total) == float(parts["loss"])
  total_z, parts_z = objective(with_z, batch)
  lse = jax.nn.logsumexp(_logits(with_z, batch["inputs_BxL"]), axis=-1)
  assert float(parts_z["z_loss"]) == pytest.approx(float(jnp.mean(lse**2)), rel=1e-6)
  assert float(parts_z["loss"]) == float(parts["loss"])  # same parameters
  expected = float(parts["loss"]) + 1e-4 * float(parts_z["z_loss"])
  assert float(total_z) == pytest.approx(expected, rel=1e-6)
  evaluate = nnx.jit(lambda m, b: m.evaluate(b))
  np.testing.assert_array_equal(evaluate(plain, batch)["loss"], evaluate(with_z, batch)["loss"])
  fns = step_lib.pure_fns(with_z.cfg, step_lib.OptimizerConfig())
  params = nnx.to_pure_dict(nnx.state(with_z))  # the built model's: no init step to compile
  opt_state = step_lib.make_optimizer(step_lib.OptimizerConfig()).init(params)
  state = step_lib.TrainState(jnp.zeros((), jnp.int32), params, opt_state)
  _, metrics = jax.jit(fns.train)(state, batch)
  assert float(metrics["z_loss"]) > 0
