"""Every attention implementation against the plain one (models/attention.py): causal and document
masks, grouped-query heads, forward and gradient; the model's document masking at a join."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from diloco.config import variants
from diloco.inner import sharding
from diloco.models import attention as at, transformer as tr

# two rows of three documents each (ids 0, 1, 2), the joins inside blocks and on their edges
SEG_64 = jnp.array([[0] * 20 + [1] * 30 + [2] * 14, [0] * 16 + [1] * 16 + [2] * 32])


def _qkv(b, seq_len, h, g, d=8):
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, seq_len, h, d))
  return (
      q,
      jax.random.normal(ks[1], (b, seq_len, g, d)),
      jax.random.normal(ks[2], (b, seq_len, g, d)),
  )


def _grads(fn, q, k, v):
  return jax.grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v))), argnums=(0, 1, 2))(q, k, v)


def _close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(x, y, atol=atol)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("segments", [False, True])
def test_blockwise_is_the_plain_attention_forward_and_backward(causal, segments):
  q, k, v = _qkv(2, 64, 4, 2)  # grouped: 2 query heads per key/value head; 4 blocks of 16
  seg = SEG_64 if segments else None
  plain = lambda q, k, v: at.reference(q, k, v, causal, seg)
  blocks = lambda q, k, v: at.blockwise(q, k, v, causal, seg, block=16)
  _close(jax.jit(blocks)(q, k, v), plain(q, k, v), 1e-5)
  _close(jax.jit(lambda *a: _grads(blocks, *a))(q, k, v), _grads(plain, q, k, v), 2e-5)


def test_splash_in_interpret_mode_is_the_plain_attention_forward_and_backward():
  q, k, v = _qkv(1, 256, 2, 1)  # blocks of 128, the kernel's smallest; one key/value head
  seg = jnp.array([[0] * 100 + [1] * 156])
  plain = lambda q, k, v: at.reference(q, k, v, True, seg)
  kernel = lambda q, k, v: at.splash(q, k, v, True, seg, block=128, interpret=True)
  _close(kernel(q, k, v), plain(q, k, v), 1e-5)
  _close(_grads(kernel, q, k, v), _grads(plain, q, k, v), 2e-5)


def test_splash_on_a_mesh_runs_on_each_devices_rows_of_the_batch():
  mesh = sharding.make_island_mesh(jax.devices()[:4], data=2, fsdp=2)
  q, k, v = (
      jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp")))) for x in _qkv(4, 128, 2, 2)
  )

  def step(q, k, v):  # as inner/step.py traces a step: the island's mesh in context
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return at.splash(q, k, v, True, None, block=128, interpret=True)

  _close(jax.jit(step)(q, k, v), at.reference(q, k, v, True), 1e-5)


@pytest.mark.parametrize("kind", ["einsum", "dot_product_attention", "blockwise"])
def test_a_document_after_a_join_sees_nothing_of_the_one_before(kind):
  cfg = tr.ModelConfig(**{**variants.MODEL_SIZES["tiny"], "vocab_size": 256, "attention": kind})
  model = tr.Transformer(cfg, nnx.Rngs(0))
  a, b = jax.random.randint(jax.random.key(1), (2, 1, 32), 0, 256)
  packed = jnp.concatenate([a[:, :20], b[:, :12]], axis=1)  # a's first 20 tokens, then b's 12
  seg = jnp.array([[0] * 20 + [1] * 12])
  pos = jnp.array([list(range(20)) + list(range(12))])
  joined = model(packed, seg, pos)[:, 20:]
  alone = model(b[:, :12])
  np.testing.assert_allclose(joined, alone, atol=2e-5)
  other = model(packed.at[:, :20].set((packed[:, :20] + 7) % 256), seg, pos)[:, 20:]
  np.testing.assert_allclose(other, joined, atol=2e-5)  # a's tokens changed: b's logits did not
  leak = model(packed)[:, 20:]  # without segment ids b attends to a: a different result
  assert float(jnp.max(jnp.abs(leak - alone))) > 1e-3
