"""The mixture-of-experts MLP (diloco/models/moe.py): routing worked out by hand, capacity drops,
the auxiliary losses, expert parallelism, causality, and a decoupled run on moe_tiny."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from diloco.config import variants
from diloco.inner import sharding, step as step_lib
from diloco.models import moe, transformer

LN3 = math.log(3.0)


def _moe_cfg(**kw) -> transformer.ModelConfig:
  return transformer.ModelConfig(**{**variants.model_config("moe_tiny").to_dict(), **kw})


def test_top1_routing_by_hand_drops_the_token_past_capacity():
  # Tokens 0-2 prefer expert 0 (p = 0.75, 0.25), token 3 expert 1; capacity ceil(1*1*4/2) = 2.
  logits_TxE = jnp.array([[LN3, 0.0]] * 3 + [[0.0, LN3]])
  r = moe.route(logits_TxE, k=1, cap=moe.capacity(4, 2, 1, 1.0))
  d = np.asarray(r.dispatch_TxExC)
  assert d.shape == (4, 2, 2)
  assert d[0, 0, 0] == d[1, 0, 1] == d[3, 1, 0] == 1 and d.sum() == 3  # token 2 dropped
  np.testing.assert_allclose(np.asarray(r.combine_TxExC)[[0, 1, 3]].sum((1, 2)), 0.75, rtol=1e-6)
  assert float(r.dropped) == pytest.approx(0.25)
  # f = (3/4, 1/4), P = (0.625, 0.375): E * sum f P = 2 * (0.46875 + 0.09375) = 1.125.
  assert float(r.load_balance) == pytest.approx(1.125, rel=1e-6)
  # logsumexp(ln 3, 0) = ln 4 for every token.
  assert float(r.router_z) == pytest.approx(math.log(4.0) ** 2, rel=1e-6)
  # Kept: 2 tokens on expert 0, 1 on expert 1, against an even share of 1 * 4 / 2 = 2.
  np.testing.assert_allclose(np.asarray(r.load_E), [1.0, 0.5])
  # All four prefer expert 0 and it has room (capacity 4): expert 1 takes nothing.
  r = moe.route(jnp.array([[LN3, 0.0]] * 4), k=1, cap=4)
  np.testing.assert_allclose(np.asarray(r.load_E), [2.0, 0.0])


def test_top2_gates_renormalise_and_earlier_tokens_keep_their_slots():
  # Token 0 prefers expert 0 (0.75), token 1 expert 1 (0.75); capacity 1: token 0 takes expert
  # 0 and then expert 1 (its second choice comes before token 1's first), token 1 is dropped.
  logits_TxE = jnp.array([[LN3, 0.0], [0.0, LN3]])
  r = moe.route(logits_TxE, k=2, cap=1)
  d, c = np.asarray(r.dispatch_TxExC), np.asarray(r.combine_TxExC)
  assert d[0, 0, 0] == d[0, 1, 0] == 1 and d[1].sum() == 0
  np.testing.assert_allclose(c[0, :, 0], [0.75, 0.25], rtol=1e-6)  # p / (p1 + p2), sum 1
  assert float(r.dropped) == pytest.approx(0.5)
  r = moe.route(logits_TxE, k=2, cap=moe.capacity(2, 2, 2, 1.0))  # capacity 2: nothing dropped
  assert float(r.dropped) == 0 and np.asarray(r.dispatch_TxExC).sum() == 4


def test_the_layer_is_the_gated_sum_of_its_experts_and_zero_for_dropped_tokens():
  cfg = _moe_cfg(num_experts=2, top_k=1, capacity_factor=0.5, mlp="gelu")
  layer = moe.MoeMlp(cfg, nnx.Rngs(0))
  x_BxLxD = jax.random.normal(jax.random.key(1), (1, 4, cfg.d_model))
  y_BxLxD, r = layer(x_BxLxD)
  x_TxD = np.asarray(x_BxLxD[0])
  logits = x_TxD @ np.asarray(layer.router[...])
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  wi, wo = np.asarray(layer.wi[...]), np.asarray(layer.wo[...])
  seen = [0, 0]  # capacity ceil(0.5 * 1 * 4 / 2) = 1 per expert
  for t in range(4):
    e = int(np.argmax(probs[t]))
    want = np.zeros(cfg.d_model)
    if seen[e] < 1:
      want = probs[t, e] * (np.asarray(jax.nn.gelu(x_TxD[t] @ wi[e])) @ wo[e])
    seen[e] += 1
    np.testing.assert_allclose(np.asarray(y_BxLxD[0, t]), want, rtol=2e-5, atol=1e-6)
  assert float(r.dropped) == pytest.approx(1 - sum(min(s, 1) for s in seen) / 4)


def test_a_changed_token_never_changes_the_outputs_before_it():
  cfg = _moe_cfg(capacity_factor=0.5)  # tight: tokens are dropped, routing is contended
  model = transformer.Transformer(cfg, nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(2), (2, 16), 0, 256)
  changed = tokens.at[0, 8].set((tokens[0, 8] + 1) % 256)
  a, aux = model.forward(tokens)
  b, _ = model.forward(changed)
  assert float(aux["moe_dropped"]) > 0
  # Both blocks sparse: the least-loaded expert of either block, at most the mean load (1 - dropped).
  assert 0.0 <= float(aux["moe_idle_experts"]) < 1.0
  assert 0.0 <= float(aux["moe_min_load"]) <= 1.0 - float(aux["moe_dropped"]) + 1e-6
  np.testing.assert_array_equal(np.asarray(a[:, :8]), np.asarray(b[:, :8]))
  assert not np.array_equal(np.asarray(a[0, 8:]), np.asarray(b[0, 8:]))


def test_expert_sharded_and_unsharded_give_the_same_loss_and_step():
  cfg, opt = _moe_cfg(), step_lib.OptimizerConfig()
  devices = jax.devices()[:8]
  flat = step_lib.build_step_fns(cfg, opt, sharding.make_island_mesh(devices, 8, 1))
  ep = step_lib.build_step_fns(cfg, opt, sharding.make_island_mesh(devices, 2, 1, expert=4))
  assert ep.state_shardings.params["blocks"][0]["moe"]["wi"].spec[0] == sharding.EXPERT
  assert ep.mesh.shape == {"data": 2, "fsdp": 1, "expert": 4}
  tokens = np.asarray(jax.random.randint(jax.random.key(3), (8, 17), 0, 256), np.int32)
  batch = {"inputs_BxL": tokens[:, :-1], "targets_BxL": tokens[:, 1:]}
  out = []
  for fns in (flat, ep):
    state = fns.init(jax.random.key(0))
    loss = float(fns.eval(state.params, step_lib.put_batch(batch, fns.mesh)))
    _, metrics = fns.train(state, step_lib.put_batch(batch, fns.mesh))
    out.append((loss, {k: float(v) for k, v in metrics.items()}))
  assert out[0][0] == pytest.approx(out[1][0], rel=1e-5)
  keys = ("loss", "moe_load_balance", "moe_router_z", "moe_dropped", "moe_idle_experts")
  for key in keys + ("moe_min_load", "grad_norm"):
    assert out[0][1][key] == pytest.approx(out[1][1][key], rel=1e-4), key
  assert out[0][1]["loss"] == pytest.approx(out[0][0], rel=1e-6)  # metrics' loss: CE alone


def test_config_checks_and_active_flops():
  with pytest.raises(ValueError, match="model.top_k=3"):
    _moe_cfg(top_k=3)
  with pytest.raises(ValueError, match="model.capacity_factor"):
    _moe_cfg(capacity_factor=0.0)
  with pytest.raises(ValueError, match="mesh.expert=3 does not divide 8"):
    sharding.make_island_mesh(jax.devices()[:8], -1, 1, expert=3)
  small, moe_small = (
      transformer.ModelConfig(**variants.model_config(n).to_dict()) for n in ("small", "moe_small")
  )
  # Same active weights (top-2 of experts half as wide), plus the routers of the 2 sparse blocks
  # (d x E = 128 x 8 each), 6 FLOPs per weight.
  extra = transformer.flops_per_token(moe_small, 64) - transformer.flops_per_token(small, 64)
  assert extra == 6 * 2 * 128 * 8
  assert [moe_small.is_moe(i) for i in range(4)] == [False, True, False, True]


@pytest.mark.parametrize("mode", ["decoupled"])
def test_moe_tiny_runs_runlocal_and_logs_its_routing(tmp_path, mode):
  import json  # pylint: disable=import-outside-toplevel

  from configs import shakespeare  # pylint: disable=import-outside-toplevel
  from diloco import train  # pylint: disable=import-outside-toplevel
  from test_islands import MULTI_KEYS  # pylint: disable=import-outside-toplevel
  from test_train import SUMMARY_KEYS  # pylint: disable=import-outside-toplevel

  c = shakespeare.get_config(f"mode={mode},runlocal,model=moe_tiny,steps=16")
  with c.unlocked():
    c.progress_bar = False
    c.timeline = False
  s = train.train_and_evaluate(c, str(tmp_path))
  assert (MULTI_KEYS if mode != "dp" else SUMMARY_KEYS) <= set(s)
  assert s["params"] == 41_376 and math.isfinite(s["eval_loss"])
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  routed = [r for r in rows if any(k.endswith("moe_load_balance") for k in r)]
  assert routed, "no routing stats were logged"
  for r in routed:
    lb = next(v for k, v in r.items() if k.endswith("moe_load_balance"))
    dropped = next(v for k, v in r.items() if k.endswith("moe_dropped"))
    idle = next(v for k, v in r.items() if k.endswith("moe_idle_experts"))
    least = next(v for k, v in r.items() if k.endswith("moe_min_load"))
    # E sum_e f_e P_e <= E max_e P_e <= E = 4 experts; positive since every token has a top one.
    assert 0.0 < lb <= 4.0 and 0.0 <= dropped < 1.0
    assert 0.0 <= idle < 1.0 and 0.0 <= least <= 1.0 - dropped + 1e-6


def test_groups_are_routed_on_their_own():
  # 2 sequences x 16 positions in groups of 16 tokens: positions 0-7 of both sequences are one
  # group (position-major order), 8-15 the other; each half alone is one group of 16.
  cfg = _moe_cfg(group_size=16, capacity_factor=0.5)
  layer = moe.MoeMlp(cfg, nnx.Rngs(0))
  x_BxLxD = jax.random.normal(jax.random.key(4), (2, 16, cfg.d_model))
  y_BxLxD, _ = layer(x_BxLxD)
  for half in (slice(0, 8), slice(8, 16)):
    np.testing.assert_allclose(
        np.asarray(y_BxLxD[:, half]), np.asarray(layer(x_BxLxD[:, half])[0]), rtol=1e-5, atol=1e-6
    )


def test_expert_usage_reads_each_learners_routing(tmp_path):
  import importlib.util  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel

  script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "expert_usage.py"
  spec = importlib.util.spec_from_file_location("expert_usage", script)
  usage_lib = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(usage_lib)
  rows = [
      {"step": 1, "learner": 0, "moe_min_load": 0.5, "moe_idle_experts": 0.0},
      {"step": 1, "learner": 1, "moe_min_load": 0.0, "moe_idle_experts": 0.25},
      {"step": 2, "learner": 0, "moe_min_load": 0.75, "moe_idle_experts": 0.0, "loss": 2.0},
      {"step": 2, "event": "merge", "learners": [0, 1]},
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  stats = usage_lib.usage(str(tmp_path / "metrics.jsonl"))
  assert stats["learner0"]["min_load"] == [0.5, 0.75]
  assert stats["learner1"]["idle_experts"] == [0.25]
  lines = usage_lib.table("run", stats)
  # learner0: 2 steps, least 0.500, mean 0.625, never idle; learner1: 1 step with an idle expert.
  assert lines[2].split() == ["learner0", "2", "0.500", "0.625", "0.000", "0", "0"]
  assert lines[3].split() == ["learner1", "1", "0.000", "0.000", "0.250", "1", "1"]
  assert usage_lib.longest_streak(np.array([1, 1, 0, 1, 1, 1, 0], bool)) == 3
