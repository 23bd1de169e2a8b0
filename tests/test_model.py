"""The transformer: causality, shapes, parameter count and FLOPs."""

import types

import jax
import jax.numpy as jnp
import numpy as np

import pytest
from flax import nnx

from diloco.config import variants
from diloco.models import transformer as tr
from diloco.outer import fragments

TINY = tr.ModelConfig(**{**variants.MODEL_SIZES["tiny"], "vocab_size": 256})


@pytest.mark.parametrize("attention", ["einsum", "dot_product_attention"])
@pytest.mark.parametrize("mlp,tied", [("swiglu", True), ("gelu", False)])
def test_changing_token_j_never_changes_outputs_before_j(attention, mlp, tied):
  cfg = tr.ModelConfig(
      **{
          **variants.MODEL_SIZES["tiny"],
          "attention": attention,
          "mlp": mlp,
          "tied_embeddings": tied,
      }
  )
  model = tr.Transformer(cfg, nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
  j = 9
  changed = tokens.at[:, j].set((tokens[:, j] + 7) % 256)
  a, b = model(tokens), model(changed)
  np.testing.assert_array_equal(a[:, :j], b[:, :j])
  assert np.abs(a[:, j:] - b[:, j:]).max() > 1e-4  # and the change is seen from j on


def test_both_attention_implementations_agree():
  model = tr.Transformer(TINY, nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(2), (2, 24), 0, 256)
  cfg2 = tr.ModelConfig(**{**variants.MODEL_SIZES["tiny"], "attention": "dot_product_attention"})
  model2 = tr.Transformer(cfg2, nnx.Rngs(0))  # same seed: same parameters
  np.testing.assert_allclose(model(tokens), model2(tokens), atol=2e-5)


def test_auto_attention_is_ours_on_gpus_splash_on_tpus_and_xlas_on_cpus():
  assert tr.attention_kind("auto", "gpu") == "einsum"
  assert tr.attention_kind("auto", "tpu") == "splash"
  assert tr.attention_kind("auto", "cpu") == "dot_product_attention"
  assert tr.attention_kind("cudnn", "cpu") == "cudnn"  # a named kind is never replaced
  tokens = jax.random.randint(jax.random.key(3), (2, 16), 0, 256)
  outputs = [
      tr.Transformer(
          tr.ModelConfig(**{**variants.MODEL_SIZES["tiny"], "attention": a}), nnx.Rngs(0)
      )(tokens)
      for a in ("auto", "dot_product_attention")
  ]
  np.testing.assert_array_equal(*outputs)  # on this CPU, auto is XLA's: the same bits


def test_param_tree_layout_and_count():
  model = tr.Transformer(TINY, nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model))
  shapes = jax.tree.map(jnp.shape, params)
  d, f, h = 32, 64, 2
  assert shapes["embed"]["embedding"] == (256, d)
  assert shapes["blocks"][1]["attn"]["qkv"] == (d, 3, h, d // h)
  assert shapes["blocks"][1]["attn"]["out"] == (h, d // h, d)
  assert shapes["blocks"][0]["mlp"]["wi"] == (d, 2, f)
  assert shapes["blocks"][0]["mlp"]["wo"] == (f, d)
  assert "unembed" not in params
  # embed 256*32 + 2 layers * (qkv 3*32*32 + out 32*32 + wi 2*32*64 + wo 64*32 + 2 norms 32)
  # + final norm 32 = 8192 + 2 * (3072 + 1024 + 4096 + 2048 + 64) + 32 = 28832.
  assert tr.param_count(params) == 28832


def test_flops_per_token_by_hand():
  # matmul weights: 2 layers * (4*32*32 + 3*32*64) + 32*256 = 2*(4096+6144) + 8192 = 28672
  # attention per layer: QK^T and AV, 2 * 2 * seq * d forward, causal half: 2 * 32 * 32 = 2048,
  # so 2 layers give 4096 forward; training is 3x forward: 6 * (28672 + 2048) = 184320.
  assert tr.flops_per_token(TINY, 32) == 184320


def test_initial_loss_matches_gaussian_logits():
  # At init the final RMSNorm output has unit RMS over D and the tied embedding rows have variance
  # 1/D (nnx.Embed's fan-in init), so each logit is ~N(0, 1). For V Gaussian logits of variance
  # s^2, E[log sum exp] ~= ln V + s^2 / 2, so the loss starts near ln 256 + 0.5 = 6.045.
  model = tr.Transformer(TINY, nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(3), (4, 32), 0, 256)
  logits = model(tokens)
  assert abs(float(jnp.std(logits)) - 1.0) < 0.1
  logp = jax.nn.log_softmax(logits)
  loss = -jnp.mean(jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1))
  assert abs(float(loss) - (np.log(256) + 0.5)) < 0.1


def test_bad_model_config_is_rejected():
  with pytest.raises(ValueError, match="divisible"):
    tr.ModelConfig(d_model=30, num_heads=4)
  with pytest.raises(ValueError, match="mlp"):
    tr.ModelConfig(mlp="relu")
  with pytest.raises(ValueError, match="model.remat 'layers'"):
    tr.ModelConfig(remat="layers")
  with pytest.raises(ValueError, match="model.attention 'flash'"):
    tr.ModelConfig(attention="flash")
  with pytest.raises(ValueError, match="model.dtype='int8'"):
    tr.ModelConfig(dtype="int8")


@pytest.mark.parametrize("remat", ["block", "dots"])
def test_rematerialisation_changes_memory_not_the_gradient(remat):
  """Recomputing in the backward pass runs the same float32 operations: same loss, gradients
  equal to float32 rounding (1e-6)."""
  tokens = jax.random.randint(jax.random.key(4), (2, 17), 0, 256)

  def loss_and_grads(cfg):
    graphdef, params = nnx.split(tr.Transformer(cfg, nnx.Rngs(0)))

    def loss(p):
      logits = nnx.merge(graphdef, p)(tokens[:, :-1])
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    return jax.jit(jax.value_and_grad(loss))(params)

  loss0, grads0 = loss_and_grads(TINY)
  loss1, grads1 = loss_and_grads(tr.ModelConfig(**{**vars(TINY), "remat": remat}))
  assert float(loss0) == pytest.approx(float(loss1), abs=1e-6)
  for a, b in zip(jax.tree.leaves(grads0), jax.tree.leaves(grads1), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_scaling_law_presets_have_the_papers_shapes():
  """Charles et al. 2025, Table 3 (layers, heads, d, MLP); with a 32k vocabulary the counts are
  the names': 6*(4*512^2 + 2*512*2048) + 32768*512 + norms = 35.66M, and so on."""
  want = {"35m": (6, 8, 512, 2048, 35.66), "90m": (9, 12, 768, 3072, 88.88)}
  want["180m"] = (12, 16, 1024, 4096, 184.57)
  for name, (layers, heads, d, f, millions) in want.items():
    cfg = tr.ModelConfig(**{**variants.model_config(name).to_dict(), "vocab_size": 32768})
    assert (cfg.num_layers, cfg.num_heads, cfg.d_model, cfg.d_ff, cfg.mlp) == (
        layers,
        heads,
        d,
        f,
        "gelu",
    )
    shapes = nnx.eval_shape(lambda cfg=cfg: tr.Transformer(cfg, nnx.Rngs(0)))
    count = tr.param_count(nnx.to_pure_dict(nnx.state(shapes)))
    assert count / 1e6 == pytest.approx(millions, abs=0.01)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN attention is allowed on a GPU")
def test_cudnn_attention_off_a_gpu_fails_when_the_island_is_built():
  from configs import shakespeare
  from diloco.inner import island

  c = shakespeare.get_config("runlocal")
  c.model.attention = "cudnn"
  with pytest.raises(ValueError, match="model.attention='cudnn' needs a GPU"):
    island.model_config(c, types.SimpleNamespace(image_shape=(), vocab_size=256))


def test_grouped_query_attention_is_attention_with_each_key_value_head_repeated():
  # 8 query heads over 2 key/value heads: heads 0-3 read kv head 0, heads 4-7 kv head 1.
  q = jax.random.normal(jax.random.key(1), (2, 16, 8, 8))
  k, v = (jax.random.normal(jax.random.key(s), (2, 16, 2, 8)) for s in (2, 3))
  grouped = tr.causal_attention(q, k, v)
  repeated = tr.causal_attention(q, jnp.repeat(k, 4, axis=2), jnp.repeat(v, 4, axis=2))
  np.testing.assert_allclose(grouped, repeated, atol=1e-6)
  np.testing.assert_allclose(
      grouped, jax.nn.dot_product_attention(q, k, v, is_causal=True), atol=1e-6
  )


def test_a_grouped_query_model_has_its_projections_and_counts_them():
  cfg = tr.ModelConfig(**{**vars(TINY), "num_heads": 4, "num_kv_heads": 2})  # Dh = 8
  model = tr.Transformer(cfg, nnx.Rngs(0))
  attn = model.blocks[0].attn
  assert attn.q.shape == (32, 4, 8) and attn.kv.shape == (32, 2, 2, 8) and not hasattr(attn, "qkv")
  # per block: q 32*32 + kv 2*32*16 + out 32*32 = 3,072 attention weights (MHA: 4,096)
  mha = tr.ModelConfig(**{**vars(TINY), "num_heads": 4})
  assert tr.flops_per_token(mha, 16) - tr.flops_per_token(cfg, 16) == 6 * 2 * (4096 - 3072)
  logits = model(jnp.zeros((1, 8), jnp.int32))
  assert logits.shape == (1, 8, 256) and bool(jnp.all(jnp.isfinite(logits)))
  with pytest.raises(ValueError, match="num_kv_heads=3 does not divide num_heads=4"):
    tr.ModelConfig(**{**vars(TINY), "num_heads": 4, "num_kv_heads": 3})


def test_the_tpu_presets_have_their_published_counts():
  """1b: 2*32000*2048 embeddings + 22*(4*2048^2 + 3*2048*5632 + 2*2048) + 2048 = 1,261,529,088;
  8b: Llama 3 8B's 8,030,261,248 (128,256 ids; q 32 and kv 8 heads of 128, SwiGLU 14,336)."""
  for name, vocab, want in (("1b", 32000, 1_261_529_088), ("8b", 128_256, 8_030_261_248)):
    cfg = tr.ModelConfig(**{**variants.model_config(name).to_dict(), "vocab_size": vocab})
    assert (cfg.dtype, cfg.remat, cfg.tied_embeddings) == ("bfloat16", "block", False)
    shapes = nnx.eval_shape(lambda cfg=cfg: tr.Transformer(cfg, nnx.Rngs(0)))
    assert tr.param_count(nnx.to_pure_dict(nnx.state(shapes))) == want


@pytest.mark.parametrize(
    "extra",
    [{"remat": "block", "num_kv_heads": 1}, {"num_experts": 4, "expert_d_ff": 32}],
    ids=["remat_gqa", "moe"],
)
def test_scanned_layers_compute_the_loops_loss_and_gradients_on_the_same_parameters(extra):
  cfg = tr.ModelConfig(**{**vars(TINY), "num_layers": 3, **extra})
  loop = tr.Transformer(cfg, nnx.Rngs(0))
  scanned = tr.Transformer(tr.ModelConfig(**{**vars(cfg), "scan_layers": True}), nnx.Rngs(0))
  # stored stacked ([3, ...] under layers/), seen per block: the loop's leaves, value for value
  pure = lambda m: nnx.to_pure_dict(nnx.state(m))
  stacked = pure(scanned)
  assert "blocks" not in stacked and stacked["layers"]["attn_norm"]["scale"].shape == (3, 32)
  flat0, flat1 = fragments.flatten(pure(loop)), fragments.flatten(stacked)
  assert list(flat0) == list(flat1)
  for k in flat0:
    np.testing.assert_array_equal(flat0[k], flat1[k])
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
  batch = {"inputs_BxL": tokens, "targets_BxL": tokens}
  grad = nnx.jit(nnx.value_and_grad(lambda m: m.objective(batch)[0]))
  (l0, g0), (l1, g1) = grad(loop), grad(scanned)
  assert float(l0) == pytest.approx(float(l1), abs=1e-6)
  g0, g1 = fragments.flatten(nnx.to_pure_dict(g0)), fragments.flatten(nnx.to_pure_dict(g1))
  assert list(g0) == list(g1)
  for k in g0:
    np.testing.assert_allclose(g0[k], g1[k], atol=1e-6)
  with pytest.raises(ValueError, match="scan_layers needs blocks of one kind"):
    tr.ModelConfig(**{**vars(cfg), "scan_layers": True, "num_experts": 4, "moe_every": 2})
