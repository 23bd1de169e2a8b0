"""A decoder-only transformer in flax nnx: pre-norm RMSNorm, rotary embeddings, causal attention.

Parameter tree (as `nnx.split(model)[1].to_pure_dict()`), which fragments and partition rules rely on:
  embed/embedding            [V, D]
  blocks/{i}/attn_norm/scale [D]
  blocks/{i}/attn/qkv        [D, 3, H, Dh]
  blocks/{i}/attn/out        [H, Dh, D]
  blocks/{i}/mlp_norm/scale  [D]
  blocks/{i}/mlp/wi          [D, F] (gelu) or [D, 2, F] (swiglu)
  blocks/{i}/mlp/wo          [F, D]
  final_norm/scale           [D]
  unembed/kernel             [D, V]   (only when embeddings are untied)
"""

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

ATTENTION = ("einsum", "dot_product_attention", "cudnn")
# What each block keeps for the backward pass: everything; only its input (recompute the block);
# the outputs of matmuls without batch dimensions (recompute the rest: norms, activations).
REMAT = {
    "none": None,
    "block": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes and numerics of the transformer."""

  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  d_ff: int = 512
  max_len: int = 1024
  mlp: Literal["swiglu", "gelu"] = "swiglu"
  tied_embeddings: bool = True
  # einsum: ours; dot_product_attention: jax.nn's (XLA); cudnn: jax.nn's cuDNN fused kernel (GPU)
  attention: Literal["einsum", "dot_product_attention", "cudnn"] = "einsum"
  rope_base: float = 10_000.0
  dtype: str = "float32"  # compute dtype; parameters (and optimizer state) are always float32.
  remat: Literal["none", "block", "dots"] = "none"  # recompute in the backward pass: REMAT

  def __post_init__(self):
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    if (self.d_model // self.num_heads) % 2:
      raise ValueError("head dimension must be even for rotary embeddings")
    if self.mlp not in ("swiglu", "gelu"):
      raise ValueError(f"unknown mlp {self.mlp!r}; expected 'swiglu' or 'gelu'")
    if self.attention not in ATTENTION:
      raise ValueError(f"unknown model.attention {self.attention!r}; expected one of {ATTENTION}")
    if self.remat not in REMAT:
      raise ValueError(f"unknown model.remat {self.remat!r}; expected one of {tuple(REMAT)}")
    if self.dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(f"model.dtype={self.dtype!r}: expected float32, bfloat16 or float16")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads


def _init(rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int) -> nnx.Param:
  return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) * fan_in**-0.5)


class RMSNorm(nnx.Module):
  """Root-mean-square norm with a learned scale (initialised to 1)."""

  def __init__(self, dim: int):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    x32 = x_BxLxD.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * self.scale[...][None, None, :]).astype(x_BxLxD.dtype)


def rotary(x_BxLxHxK: jax.Array, base: float) -> jax.Array:
  """Rotates pairs (first half, second half) of each head by position-dependent angles."""
  _, seq_len, _, head_dim = x_BxLxHxK.shape
  half = head_dim // 2
  freq_K = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_LxK = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * freq_K[None, :]
  sin, cos = jnp.sin(angle_LxK)[None, :, None, :], jnp.cos(angle_LxK)[None, :, None, :]
  x1, x2 = x_BxLxHxK[..., :half].astype(jnp.float32), x_BxLxHxK[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxK.dtype)


class Attention(nnx.Module):
  """Multi-head causal self-attention with rotary position embeddings."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h, k = cfg.d_model, cfg.num_heads, cfg.head_dim
    self.qkv = _init(rngs, (d, 3, h, k), d)
    self.out = _init(rngs, (h, k, d), d)

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    cfg = self.cfg
    dtype = x_BxLxD.dtype
    qkv_BxLx3xHxK = jnp.einsum("bld,dthk->blthk", x_BxLxD, self.qkv[...].astype(dtype))
    q_BxLxHxK = rotary(qkv_BxLx3xHxK[:, :, 0], cfg.rope_base)
    k_BxLxHxK = rotary(qkv_BxLx3xHxK[:, :, 1], cfg.rope_base)
    v_BxLxHxK = qkv_BxLx3xHxK[:, :, 2]
    if cfg.attention != "einsum":
      impl = "cudnn" if cfg.attention == "cudnn" else None
      o_BxLxHxK = jax.nn.dot_product_attention(
          q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, is_causal=True, implementation=impl
      )
    else:
      o_BxLxHxK = causal_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK)
    return jnp.einsum("blhk,hkd->bld", o_BxLxHxK, self.out[...].astype(dtype))


def causal_attention(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, v_BxLxHxK: jax.Array) -> jax.Array:
  """Softmax attention with a causal mask, logits in float32."""
  seq_len, head_dim = q_BxLxHxK.shape[1], q_BxLxHxK.shape[3]
  logits_BxHxLxL = jnp.einsum("bqhk,bshk->bhqs", q_BxLxHxK, k_BxLxHxK).astype(jnp.float32)
  logits_BxHxLxL = logits_BxHxLxL * head_dim**-0.5
  mask_1x1xLxL = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))[None, None]
  logits_BxHxLxL = jnp.where(mask_1x1xLxL, logits_BxHxLxL, jnp.finfo(jnp.float32).min)
  att_BxHxLxL = jax.nn.softmax(logits_BxHxLxL, axis=-1).astype(v_BxLxHxK.dtype)
  return jnp.einsum("bhqs,bshk->bqhk", att_BxHxLxL, v_BxLxHxK)


class Mlp(nnx.Module):
  """Feed-forward block: SwiGLU (gated) or plain GELU."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.gated = cfg.mlp == "swiglu"
    d, f = cfg.d_model, cfg.d_ff
    self.wi = _init(rngs, (d, 2, f) if self.gated else (d, f), d)
    self.wo = _init(rngs, (f, d), f)

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    dtype = x_BxLxD.dtype
    if self.gated:
      h_BxLx2xF = jnp.einsum("bld,dtf->bltf", x_BxLxD, self.wi[...].astype(dtype))
      h_BxLxF = jax.nn.silu(h_BxLx2xF[:, :, 0]) * h_BxLx2xF[:, :, 1]
    else:
      h_BxLxF = jax.nn.gelu(jnp.einsum("bld,df->blf", x_BxLxD, self.wi[...].astype(dtype)))
    return jnp.einsum("blf,fd->bld", h_BxLxF, self.wo[...].astype(dtype))


class Block(nnx.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.d_model)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.d_model)
    self.mlp = Mlp(cfg, rngs)

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    x_BxLxD = x_BxLxD + self.attn(self.attn_norm(x_BxLxD))
    return x_BxLxD + self.mlp(self.mlp_norm(x_BxLxD))


class Transformer(nnx.Module):
  """Decoder-only language model mapping token ids to next-token logits."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, rngs=rngs)
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.d_model)
    if not cfg.tied_embeddings:
      self.unembed = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, rngs=rngs)

  def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
    cfg = self.cfg
    if tokens_BxL.shape[1] > cfg.max_len:
      raise ValueError(f"sequence length {tokens_BxL.shape[1]} exceeds max_len={cfg.max_len}")
    x_BxLxD = self.embed(tokens_BxL).astype(cfg.dtype)
    for block in self.blocks:
      if cfg.remat == "none":
        x_BxLxD = block(x_BxLxD)
      else:
        x_BxLxD = nnx.remat(lambda b, x: b(x), policy=REMAT[cfg.remat])(block, x_BxLxD)
    x_BxLxD = self.final_norm(x_BxLxD)
    if cfg.tied_embeddings:
      table_VxD = self.embed.embedding[...].astype(cfg.dtype)
      logits_BxLxV = jnp.einsum("bld,vd->blv", x_BxLxD, table_VxD)
    else:
      logits_BxLxV = self.unembed(x_BxLxD)
    return logits_BxLxV.astype(jnp.float32)


def param_count(params) -> int:
  """Number of scalar parameters in a params tree."""
  return int(sum(x.size for x in jax.tree.leaves(params)))


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token: 6 per matmul weight plus causal attention (Kaplan et al. 2020 style).

  Counts matmul weights (embedding lookup excluded, unembedding included) at 6 FLOPs each
  (2 forward, 4 backward), plus attention scores and values: 6 * 2 * L_layers * seq_len * D,
  halved for the causal mask.
  """
  d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
  mlp_in = d * f * (2 if cfg.mlp == "swiglu" else 1)
  per_layer = 3 * d * d + d * d + mlp_in + f * d
  matmul_weights = cfg.num_layers * per_layer + d * v
  attention = 2 * cfg.num_layers * seq_len * d / 2
  return 6.0 * matmul_weights + 6.0 * attention
