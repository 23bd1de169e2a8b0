"""Attention implementations with one signature: q [B, L, H, Dh], k and v [B, L, G, Dh] (G key/value
heads, each serving H / G query heads), an optional causal mask and optional segment ids [B, L]
(a token attends only to tokens of its own segment: packed documents). Logits in float32.

  einsum                 ours, the whole [L, L] score matrix (the reference of the tests)
  dot_product_attention  jax.nn's (XLA's; a score matrix too)
  cudnn                  jax.nn's cuDNN fused kernel (GPU, bf16)
  blockwise              pure JAX, flash style: query blocks in turn (each rematerialised in the
                         backward pass), key blocks scanned with an online softmax; never more
                         than a [block, block] score tile per head; fully masked causal blocks
                         are skipped
  splash                 the Pallas TPU kernel (jax.experimental.pallas.ops.tpu.splash_attention),
                         causal and segment masks, blocks of 512, 256 or 128 (a sequence none of
                         them tiles runs XLA's); off a TPU only in interpret mode (tests)
  auto                   what measured fastest or fits: einsum on GPUs (BENCHMARKS.md), splash on
                         TPUs, dot_product_attention on CPUs (the project's CPU results)
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

KINDS = ("auto", "einsum", "dot_product_attention", "cudnn", "blockwise", "splash")
AUTO = {"gpu": "einsum", "tpu": "splash"}
BLOCK = 512  # blockwise and splash: query and key block length (a shorter sequence: one block)
SPLASH_MIN_BLOCK = 128  # the kernel's blocks are multiples of 128; other lengths go to XLA's
BATCH_AXES = ("data", "fsdp", "expert")  # the mesh axes a batch is split over (inner/sharding.py)


def kind_on(name: str, backend: str | None = None) -> str:
  """The implementation `name` means on `backend` (default: JAX's)."""
  if name != "auto":
    return name
  return AUTO.get(backend or jax.default_backend(), "dot_product_attention")


def attend(kind, q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, causal=True, segment_ids_BxL=None):
  """Attention by the implementation `kind` (not 'auto': resolve it with `kind_on` first)."""
  if kind == "einsum":
    return reference(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, causal, segment_ids_BxL)
  if kind == "blockwise":
    return blockwise(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, causal, segment_ids_BxL)
  if kind == "splash" and q_BxLxHxK.shape[1] % SPLASH_MIN_BLOCK == 0:
    return splash(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, causal, segment_ids_BxL)
  # (splash over a sequence its blocks cannot tile: XLA's, as for any short sequence)
  mask = None
  if segment_ids_BxL is not None:
    mask = (segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :])[:, None]  # [B, 1, L, L]
  impl = "cudnn" if kind == "cudnn" else None
  return jax.nn.dot_product_attention(
      q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, mask=mask, is_causal=causal, implementation=impl
  )


def reference(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, causal=True, segment_ids_BxL=None):
  """Softmax attention over the whole score matrix, logits in float32."""
  b, seq_len, h, head_dim = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  if g != h:  # grouped: a key/value head's H / G query heads side by side
    q_BxLxGxRxK = q_BxLxHxK.reshape(b, seq_len, g, h // g, head_dim)
    logits = jnp.einsum("bqgrk,bsgk->bgrqs", q_BxLxGxRxK, k_BxLxGxK)
    logits_BxHxLxL = logits.reshape(b, h, seq_len, seq_len).astype(jnp.float32)
  else:
    logits_BxHxLxL = jnp.einsum("bqhk,bshk->bhqs", q_BxLxHxK, k_BxLxGxK).astype(jnp.float32)
  logits_BxHxLxL = logits_BxHxLxL * head_dim**-0.5
  if causal:
    mask_1x1xLxL = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))[None, None]
    logits_BxHxLxL = jnp.where(mask_1x1xLxL, logits_BxHxLxL, jnp.finfo(jnp.float32).min)
  if segment_ids_BxL is not None:
    same_Bx1xLxL = (segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :])[:, None]
    logits_BxHxLxL = jnp.where(same_Bx1xLxL, logits_BxHxLxL, jnp.finfo(jnp.float32).min)
  att_BxHxLxL = jax.nn.softmax(logits_BxHxLxL, axis=-1).astype(v_BxLxGxK.dtype)
  if g == h:
    return jnp.einsum("bhqs,bshk->bqhk", att_BxHxLxL, v_BxLxGxK)
  att_BxGxRxLxL = att_BxHxLxL.reshape(b, g, h // g, seq_len, seq_len)
  o_BxLxGxRxK = jnp.einsum("bgrqs,bsgk->bqgrk", att_BxGxRxLxL, v_BxLxGxK)
  return o_BxLxGxRxK.reshape(b, seq_len, h, head_dim)


def _block(seq_len: int, block: int) -> int:
  """The block length: `block` when it divides the sequence, else the whole sequence."""
  return block if seq_len % block == 0 else seq_len


def blockwise(
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, causal=True, segment_ids_BxL=None, block: int = BLOCK
):
  """Flash-style attention in pure JAX: per query block (rematerialised in the backward pass) an
  online softmax over key blocks, so memory holds one [block, block] tile of scores per head."""
  b, seq_len, h, d = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  n = _block(seq_len, block)
  blocks = seq_len // n
  q_NxBxSxGxRxK = jnp.moveaxis(q_BxLxHxK.reshape(b, blocks, n, g, h // g, d), 1, 0)
  k_NxBxSxGxK = jnp.moveaxis(k_BxLxGxK.reshape(b, blocks, n, g, d), 1, 0)
  v_NxBxSxGxK = jnp.moveaxis(v_BxLxGxK.reshape(b, blocks, n, g, d), 1, 0)
  seg = segment_ids_BxL if segment_ids_BxL is not None else jnp.zeros((b, seq_len), jnp.int32)
  seg_NxBxS = jnp.moveaxis(seg.reshape(b, blocks, n), 1, 0)

  @jax.checkpoint
  def query_block(i, q_BxSxGxRxK, qseg_BxS):
    q32 = q_BxSxGxRxK.astype(jnp.float32) * d**-0.5
    neg = jnp.finfo(jnp.float32).min

    def key_block(carry, j):
      m_BxGxRxS, l_BxGxRxS, o_BxSxGxRxK = carry

      def update(_):
        s = jnp.einsum("bqgrk,bsgk->bgrqs", q32, k_NxBxSxGxK[j].astype(jnp.float32))
        keep_BxSxS = qseg_BxS[:, :, None] == seg_NxBxS[j][:, None, :]
        if causal:
          pos = jnp.arange(n)
          keep_BxSxS &= ((i * n + pos)[:, None] >= (j * n + pos)[None, :])[None]
        keep = keep_BxSxS[:, None, None]
        s = jnp.where(keep, s, neg)
        m_new = jnp.maximum(m_BxGxRxS, jnp.max(s, axis=-1))
        p = jnp.where(keep, jnp.exp(s - m_new[..., None]), 0.0)
        scale = jnp.exp(m_BxGxRxS - m_new)
        l_new = l_BxGxRxS * scale + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bgrqs,bsgk->bqgrk", p, v_NxBxSxGxK[j].astype(jnp.float32))
        o_new = o_BxSxGxRxK * jnp.moveaxis(scale, 3, 1)[..., None] + pv
        return m_new, l_new, o_new

      if not causal:
        return update(None), None
      return jax.lax.cond(j <= i, update, lambda _: carry, None), None  # later blocks: masked

    init = (
        jnp.full((b, g, h // g, n), neg, jnp.float32),
        jnp.zeros((b, g, h // g, n), jnp.float32),
        jnp.zeros((b, n, g, h // g, d), jnp.float32),
    )
    (_, l_BxGxRxS, o_BxSxGxRxK), _ = jax.lax.scan(key_block, init, jnp.arange(blocks))
    return o_BxSxGxRxK / jnp.moveaxis(l_BxGxRxS, 3, 1)[..., None]

  o = jax.lax.map(lambda a: query_block(*a), (jnp.arange(blocks), q_NxBxSxGxRxK, seg_NxBxS))
  return jnp.moveaxis(o, 0, 1).reshape(b, seq_len, h, d).astype(v_BxLxGxK.dtype)


def splash(
    q_BxLxHxK,
    k_BxLxGxK,
    v_BxLxGxK,
    causal=True,
    segment_ids_BxL=None,
    block: int = BLOCK,
    interpret: bool | None = None,
):
  """The Pallas splash kernel (TPU): each key/value head repeated to its query heads, one
  kernel per batch row; interpret mode off a TPU (slow: tests only)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as kernel,
      splash_attention_mask as masks,
  )

  b, seq_len, h, d = q_BxLxHxK.shape
  g = k_BxLxGxK.shape[2]
  mesh = jax.sharding.get_abstract_mesh()  # inner/step.py traces a step with its island's mesh
  if interpret is None:  # the devices compiled for: a plan compiles for a TPU on a CPU
    device = None if mesh.empty else mesh.abstract_device
    interpret = (device.platform if device else jax.default_backend()) != "tpu"
  n = next(x for x in (block, 256, SPLASH_MIN_BLOCK) if seq_len % x == 0 and x % 128 == 0)
  one = masks.CausalMask((seq_len, seq_len)) if causal else masks.FullMask((seq_len, seq_len))
  sizes = kernel.BlockSizes(
      block_q=n, block_kv=n, block_kv_compute=n, block_q_dkv=n, block_kv_dkv=n,
      block_kv_dkv_compute=n, block_q_dq=n, block_kv_dq=n,
  )  # fmt: skip
  attn = kernel.make_splash_mha(
      masks.MultiHeadMask([one] * h),
      block_sizes=sizes,
      head_shards=1,
      q_seq_shards=1,
      interpret=interpret,
  )

  def per_device(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, seg_BxL):
    q_BxHxLxK = jnp.swapaxes(q_BxLxHxK, 1, 2) * d**-0.5  # the kernel does not scale
    k_BxHxLxK = jnp.swapaxes(jnp.repeat(k_BxLxGxK, h // g, axis=2), 1, 2)
    v_BxHxLxK = jnp.swapaxes(jnp.repeat(v_BxLxGxK, h // g, axis=2), 1, 2)
    if seg_BxL is None:
      o = jax.vmap(attn)(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK)
    else:
      one_row = lambda q, k, v, s: attn(q, k, v, segment_ids=kernel.SegmentIds(q=s, kv=s))
      o = jax.vmap(one_row)(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, seg_BxL)
    return jnp.swapaxes(o, 1, 2).astype(v_BxLxGxK.dtype)

  if mesh.empty:
    return per_device(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL)
  # a kernel is not partitioned by the compiler: each device runs it on its rows of the batch
  rows = P(tuple(a for a in BATCH_AXES if a in mesh.axis_names))
  specs = (rows, rows, rows, None if segment_ids_BxL is None else rows)
  mapped = jax.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=rows, check_vma=False)
  return mapped(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL)
