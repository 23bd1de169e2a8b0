"""The losses of the models: cross entropy of integer targets (masked where documents are packed),
the output z-loss, and a mixture of experts' auxiliary losses."""

import jax
import jax.numpy as jnp


def token_nll(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> jax.Array:
  """Cross entropy in nats of each integer target (any leading shape)."""
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
  return -jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]


def cross_entropy(
    logits_BxLxV: jax.Array, targets_BxL: jax.Array, mask_BxL: jax.Array | None = None
) -> jax.Array:
  """Mean cross entropy in nats of integer targets (any leading shape); with a mask, over the
  targets it keeps (packed documents: none across a join)."""
  return masked_mean(token_nll(logits_BxLxV, targets_BxL), mask_BxL)


def masked_mean(x: jax.Array, mask: jax.Array | None, axis: int | None = None) -> jax.Array:
  """The mean of x over `axis` (None: all), over the entries the mask keeps where there is one."""
  if mask is None:
    return jnp.mean(x, axis=axis)
  mask = mask.astype(x.dtype)
  return jnp.sum(x * mask, axis=axis) / jnp.maximum(jnp.sum(mask, axis=axis), 1.0)


def output_z_loss(logits_BxLxV: jax.Array) -> jax.Array:
  """mean(logsumexp(logits)^2) over positions: pulls log Z towards 0 (PaLM's z-loss)."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(logits_BxLxV, axis=-1)))


def with_aux_losses(cfg, loss: jax.Array, aux: dict) -> jax.Array:
  """The loss plus the weighted load-balancing and router z losses of a mixture of experts."""
  if not aux:
    return loss
  return (
      loss + cfg.aux_loss_weight * aux["moe_load_balance"] + cfg.z_loss_weight * aux["moe_router_z"]
  )
