"""A decoder-only transformer in flax nnx: pre-norm RMSNorm, rotary embeddings, causal attention.

Parameter tree (as `nnx.split(model)[1].to_pure_dict()`), which fragments and partition rules rely on:
  embed/embedding            [V, D]
  blocks/{i}/attn_norm/scale [D]
  blocks/{i}/attn/qkv        [D, 3, H, Dh]  (as many key/value heads as query heads; else
  blocks/{i}/attn/q          [D, H, Dh]      grouped-query attention: Hkv = num_kv_heads
  blocks/{i}/attn/kv         [D, 2, Hkv, Dh]  shared key/value heads, H / Hkv queries each)
  blocks/{i}/attn/out        [H, Dh, D]
  blocks/{i}/attn/q_norm/scale [Dh]  (only with `qk_norm`; likewise k_norm/scale)
  blocks/{i}/mlp_norm/scale  [D]
  blocks/{i}/mlp/wi          [D, F] (gelu) or [D, 2, F] (swiglu)
  blocks/{i}/mlp/wo          [F, D]
  blocks/{i}/moe/router      [D, E]        (instead of mlp/ in a mixture-of-experts block:
  blocks/{i}/moe/wi          [E, D, 2, F]   models/moe.py; `num_experts` > 0, every
  blocks/{i}/moe/wo          [E, F, D]      `moe_every`-th block)
  final_norm/scale           [D]
  unembed/kernel             [D, V]   (only when embeddings are untied)
With `scan_layers` the blocks are stored stacked instead: layers/attn/q [N, D, H, Dh] and so on, a
leading layer axis on each block leaf (models/layer_stack.py shows them to the outer loop as the
blocks/{i}/... above).
"""

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from diloco.models import attention, logical, moe
from diloco.models.blocks import REMAT, blocks_of, run_blocks, set_blocks
from diloco.models.losses import cross_entropy, masked_mean, output_z_loss, token_nll, with_aux_losses

ATTENTION = attention.KINDS
# auto (attention.AUTO): what measured fastest on the backend (BENCHMARKS.md): ours on GPUs (1.17x
# XLA's for `base` in bf16 on an H200), splash on TPUs (no score matrix), XLA's
# dot_product_attention on CPUs (within 2% of ours either way, and the default the project's CPU
# results were measured with).
attention_kind = attention.kind_on  # the attention a config's `model.attention` means on a backend
causal_attention = attention.reference


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes and numerics of the transformer."""

  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 0  # key/value heads (grouped-query attention); 0: num_heads
  d_ff: int = 512
  max_len: int = 1024
  mlp: Literal["swiglu", "gelu"] = "swiglu"
  tied_embeddings: bool = True
  # models/attention.py: einsum (ours) | dot_product_attention (XLA's) | cudnn (GPU) | blockwise
  # (pure JAX, flash style) | splash (Pallas, TPU) | auto (attention_kind)
  attention: Literal["auto", "einsum", "dot_product_attention", "cudnn", "blockwise", "splash"] = (
      "einsum"
  )
  rope_base: float = 10_000.0
  dtype: str = "float32"  # compute dtype; parameters (and optimizer state) are always float32.
  remat: Literal["none", "block", "dots"] = "none"  # recompute in the backward pass: REMAT
  # run the blocks as one jax.lax.scan over their parameters stacked in the step (compiled once,
  # whatever the depth); the parameters stay per block (blocks/{i}/...), so fragments, sharding
  # rules and checkpoints are those of the loop. Needs blocks of one kind (moe_every = 1).
  scan_layers: bool = False
  # Mixture of experts (models/moe.py): 0 experts is a dense model. Blocks moe_every-1,
  # 2*moe_every-1, ... are sparse; each expert has width expert_d_ff (0: d_ff).
  num_experts: int = 0
  top_k: int = 2
  capacity_factor: float = 1.25
  expert_d_ff: int = 0
  moe_every: int = 1
  group_size: int = 1024  # tokens routed together (capacity per group; models/moe.py)
  aux_loss_weight: float = 0.01  # the load-balancing loss's weight in the training objective
  z_loss_weight: float = 0.001  # the router z-loss's
  causal: bool = True  # attention masks later positions (a decoder); False for vision
  qk_norm: bool = False  # RMSNorm of each head's queries and keys (learned scale) before rotary
  # weight of the output z-loss, mean(logsumexp(logits)^2), in a decoder's training objective
  z_loss: float = 0.0
  # batches pack documents (a prepared corpus, data/corpus/stream.py): they carry segment ids,
  # positions and a loss mask (`batch_example`), which the step's shardings must name
  packed: bool = False

  def __post_init__(self):
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    if self.num_kv_heads < 0 or self.num_heads % self.kv_heads:
      raise ValueError(
          f"model.num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}"
      )
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
    if self.num_experts < 0 or self.moe_every < 1 or self.expert_d_ff < 0 or self.group_size < 0:
      raise ValueError(
          f"model.num_experts={self.num_experts}, model.moe_every={self.moe_every}, "
          f"model.expert_d_ff={self.expert_d_ff}, model.group_size={self.group_size}: need >= 0, "
          ">= 1, >= 0 and >= 0"
      )
    if self.num_experts and not 1 <= self.top_k <= min(2, self.num_experts):
      raise ValueError(
          f"model.top_k={self.top_k}: 1 or 2, at most model.num_experts={self.num_experts}"
      )
    if self.num_experts and self.capacity_factor <= 0:
      raise ValueError(f"model.capacity_factor must be > 0, got {self.capacity_factor}")
    if not self.z_loss >= 0:
      raise ValueError(f"model.z_loss={self.z_loss}: must be >= 0")
    if self.scan_layers and self.num_experts and self.moe_every != 1:
      raise ValueError(
          f"model.scan_layers needs blocks of one kind: model.moe_every={self.moe_every} mixes"
          " dense and sparse blocks (set moe_every=1 or scan_layers=False)"
      )

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def expert_width(self) -> int:
    return self.expert_d_ff or self.d_ff

  def is_moe(self, layer: int) -> bool:
    return self.num_experts > 0 and layer % self.moe_every == self.moe_every - 1

  def batch_example(self, batch: int = 1) -> dict[str, jax.ShapeDtypeStruct]:
    """The batch this model trains on, as shapes: next-token prediction over sequences."""
    seq = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
    out = {"inputs_BxL": seq, "targets_BxL": seq}
    if self.packed:
      out.update(segment_ids_BxL=seq, positions_BxL=seq, targets_mask_BxL=seq)
    return out

  def build(self, rngs: nnx.Rngs) -> "Transformer":
    return Transformer(self, rngs)


def _init(rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int) -> nnx.Param:
  return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) * fan_in**-0.5)


class RMSNorm(nnx.Module):
  """Root-mean-square norm over the last axis with a learned scale (initialised to 1)."""

  def __init__(self, dim: int):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    x32 = x_BxLxD.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    scale = self.scale[...].reshape((1,) * (y.ndim - 1) + (-1,))  # any leading axes
    return (y * scale).astype(x_BxLxD.dtype)


def rotary(x_BxLxHxK: jax.Array, base: float, positions_BxL: jax.Array | None = None) -> jax.Array:
  """Rotates pairs (first half, second half) of each head by position-dependent angles; the
  positions are 0..L-1 unless given (per document in a packed sequence)."""
  _, seq_len, _, head_dim = x_BxLxHxK.shape
  half = head_dim // 2
  freq_K = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if positions_BxL is None:
    angle_LxK = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * freq_K[None, :]
    sin, cos = jnp.sin(angle_LxK)[None, :, None, :], jnp.cos(angle_LxK)[None, :, None, :]
  else:
    angle_BxLxK = positions_BxL.astype(jnp.float32)[..., None] * freq_K[None, None, :]
    sin, cos = jnp.sin(angle_BxLxK)[:, :, None, :], jnp.cos(angle_BxLxK)[:, :, None, :]
  x1, x2 = x_BxLxHxK[..., :half].astype(jnp.float32), x_BxLxHxK[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxK.dtype)


class Attention(nnx.Module):
  """Multi-head causal self-attention with rotary position embeddings; grouped-query when
  `num_kv_heads` < `num_heads` (each key/value head serves H / Hkv query heads). With `qk_norm`,
  queries and keys are RMS-normed: with unit norm scales every logit is within +-sqrt(Dh)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    if g == h:
      self.qkv = _init(rngs, (d, 3, h, k), d)
    else:
      self.q = _init(rngs, (d, h, k), d)
      self.kv = _init(rngs, (d, 2, g, k), d)
    self.out = _init(rngs, (h, k, d), d)
    if cfg.qk_norm:
      self.q_norm, self.k_norm = RMSNorm(k), RMSNorm(k)

  def queries_keys_values(
      self, x_BxLxD: jax.Array, positions_BxL: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [B, L, H, Dh], k and v [B, L, Hkv, Dh]: q and k normed with `qk_norm`, then rotated."""
    cfg, dtype = self.cfg, x_BxLxD.dtype
    if hasattr(self, "qkv"):
      qkv_BxLx3xHxK = jnp.einsum("bld,dthk->blthk", x_BxLxD, self.qkv[...].astype(dtype))
      q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = (qkv_BxLx3xHxK[:, :, i] for i in range(3))
    else:
      q_BxLxHxK = jnp.einsum("bld,dhk->blhk", x_BxLxD, self.q[...].astype(dtype))
      kv_BxLx2xGxK = jnp.einsum("bld,dtgk->bltgk", x_BxLxD, self.kv[...].astype(dtype))
      k_BxLxGxK, v_BxLxGxK = kv_BxLx2xGxK[:, :, 0], kv_BxLx2xGxK[:, :, 1]
    q_BxLxHxK = logical.constrain(q_BxLxHxK, logical.HEADS)
    k_BxLxGxK = logical.constrain(k_BxLxGxK, logical.KV_HEADS)
    v_BxLxGxK = logical.constrain(v_BxLxGxK, logical.KV_HEADS)
    if cfg.qk_norm:
      q_BxLxHxK, k_BxLxGxK = self.q_norm(q_BxLxHxK), self.k_norm(k_BxLxGxK)
    q_BxLxHxK = rotary(q_BxLxHxK, cfg.rope_base, positions_BxL)
    k_BxLxGxK = rotary(k_BxLxGxK, cfg.rope_base, positions_BxL)
    return q_BxLxHxK, k_BxLxGxK, v_BxLxGxK

  def __call__(self, x_BxLxD: jax.Array, segment_ids_BxL=None, positions_BxL=None) -> jax.Array:
    """Attention within each segment (packed documents) when segment ids are given."""
    cfg = self.cfg
    dtype = x_BxLxD.dtype
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = self.queries_keys_values(x_BxLxD, positions_BxL)
    kind = attention_kind(cfg.attention)
    o_BxLxHxK = attention.attend(kind, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, cfg.causal, segment_ids_BxL)
    o_BxLxHxK = logical.constrain(o_BxLxHxK, logical.HEADS)
    return jnp.einsum("blhk,hkd->bld", o_BxLxHxK, self.out[...].astype(dtype))


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
    h_BxLxF = logical.constrain(h_BxLxF, logical.MLP)
    return jnp.einsum("blf,fd->bld", h_BxLxF, self.wo[...].astype(dtype))


class Block(nnx.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)) (or the experts')."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, sparse: bool = False):
    self.attn_norm = RMSNorm(cfg.d_model)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.d_model)
    if sparse:
      self.moe = moe.MoeMlp(cfg, rngs)
    else:
      self.mlp = Mlp(cfg, rngs)

  def __call__(
      self, x_BxLxD: jax.Array, segment_ids_BxL=None, positions_BxL=None
  ) -> tuple[jax.Array, jax.Array]:
    """The block's output and its routing stats [load_balance, router_z, dropped, idle experts'
    share, least load] (zeros when dense)."""
    x_BxLxD = x_BxLxD + self.attn(self.attn_norm(x_BxLxD), segment_ids_BxL, positions_BxL)
    x_BxLxD = logical.constrain(x_BxLxD, logical.HIDDEN)
    if not hasattr(self, "moe"):
      return x_BxLxD + self.mlp(self.mlp_norm(x_BxLxD)), jnp.zeros((5,), jnp.float32)
    y_BxLxD, r = self.moe(self.mlp_norm(x_BxLxD))
    idle = jnp.mean((r.load_E == 0).astype(jnp.float32))
    stats_5 = jnp.stack([r.load_balance, r.router_z, r.dropped, idle, jnp.min(r.load_E)])
    return x_BxLxD + y_BxLxD, stats_5


class Transformer(nnx.Module):
  """Decoder-only language model mapping token ids to next-token logits."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, rngs=rngs)
    set_blocks(self, [Block(cfg, rngs, cfg.is_moe(i)) for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.d_model)
    if not cfg.tied_embeddings:
      self.unembed = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, rngs=rngs)

  def __call__(self, tokens_BxL: jax.Array, segment_ids_BxL=None, positions_BxL=None) -> jax.Array:
    return self.forward(tokens_BxL, segment_ids_BxL, positions_BxL)[0]

  def forward(
      self, tokens_BxL: jax.Array, segment_ids_BxL=None, positions_BxL=None
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Logits and the routing stats of `run_blocks`; with segment ids each token attends only to
    its own segment (a packed document), with positions rotary restarts per document."""
    cfg = self.cfg
    if tokens_BxL.shape[1] > cfg.max_len:
      raise ValueError(f"sequence length {tokens_BxL.shape[1]} exceeds max_len={cfg.max_len}")
    x_BxLxD = logical.constrain(self.embed(tokens_BxL).astype(cfg.dtype), logical.HIDDEN)
    x_BxLxD, aux = run_blocks(cfg, blocks_of(self), x_BxLxD, segment_ids_BxL, positions_BxL)
    x_BxLxD = logical.constrain(self.final_norm(x_BxLxD), logical.HIDDEN)
    if cfg.tied_embeddings:
      table_VxD = self.embed.embedding[...].astype(cfg.dtype)
      logits_BxLxV = jnp.einsum("bld,vd->blv", x_BxLxD, table_VxD)
    else:
      logits_BxLxV = self.unembed(x_BxLxD)
    return logical.constrain(logits_BxLxV, logical.LOGITS).astype(jnp.float32), aux

  def objective(self, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """What training minimises, and its parts as metrics (`loss`: the cross entropy; with
    `z_loss` > 0, `z_loss`: the unweighted output z-loss, added times model.z_loss)."""
    logits_BxLxV, aux = self.forward(*_inputs(batch))
    loss = cross_entropy(logits_BxLxV, batch["targets_BxL"], batch.get("targets_mask_BxL"))
    total = with_aux_losses(self.cfg, loss, aux)
    if not self.cfg.z_loss:
      return total, {"loss": loss, **aux}
    z = output_z_loss(logits_BxLxV)
    return total + self.cfg.z_loss * z, {"loss": loss, "z_loss": z, **aux}

  def evaluate(self, batch) -> dict[str, jax.Array]:
    """The held-out measures of each row [B]: its next-token cross entropy (mean over tokens;
    packed documents: over the targets the mask keeps)."""
    nll_BxL = token_nll(self(*_inputs(batch)), batch["targets_BxL"])
    return {"loss": masked_mean(nll_BxL, batch.get("targets_mask_BxL"), axis=-1)}


def _inputs(batch) -> tuple:
  """A batch's token ids and, where the data packs documents, their segment ids and positions."""
  return batch["inputs_BxL"], batch.get("segment_ids_BxL"), batch.get("positions_BxL")


def param_count(params) -> int:
  """Number of scalar parameters in a params tree."""
  return int(sum(x.size for x in jax.tree.leaves(params)))


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token: 6 per matmul weight plus causal attention (Kaplan et al. 2020 style).

  Counts matmul weights (embedding lookup excluded, unembedding included) at 6 FLOPs each
  (2 forward, 4 backward), plus attention scores and values: 6 * 2 * L_layers * seq_len * D,
  halved for the causal mask. A mixture-of-experts block counts its active weights: the router
  and top_k experts.
  """
  d, v = cfg.d_model, cfg.vocab_size
  matmul_weights = d * v
  for i in range(cfg.num_layers):
    # A sparse block's active weights: the router and top_k experts (capacity aside).
    f, k = (cfg.expert_width, cfg.top_k) if cfg.is_moe(i) else (cfg.d_ff, 1)
    mlp_in = d * f * (2 if cfg.mlp == "swiglu" else 1)
    router = d * cfg.num_experts if cfg.is_moe(i) else 0
    qkv = d * cfg.head_dim * (cfg.num_heads + 2 * cfg.kv_heads)
    matmul_weights += qkv + d * d + k * (mlp_in + f * d) + router
  attention = 2 * cfg.num_layers * seq_len * d / 2
  return 6.0 * matmul_weights + 6.0 * attention
