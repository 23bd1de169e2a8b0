"""The blocks of a transformer (or ViT): held as a list or stacked on a layer axis
(`model.scan_layers`), and run in turn or as one scan, rematerialised as `model.remat` says, with
a mixture of experts' routing stats."""

import jax
import jax.numpy as jnp
from flax import nnx

# What each block keeps for the backward pass: everything; only its input (recompute the block);
# the outputs of matmuls without batch dimensions (recompute the rest: norms, activations).
REMAT = {
    "none": None,
    "block": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def set_blocks(model: nnx.Module, blocks: list) -> None:
  """The blocks as `model.blocks` (a list), or with `scan_layers` as `model.layers`: one block
  whose parameters are the blocks' stacked on a leading layer axis (built block by block, so both
  forms start from the same values)."""
  if not model.cfg.scan_layers:
    model.blocks = nnx.List(blocks)
    return
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b) for b in blocks])
  model.layers = nnx.merge(nnx.graphdef(blocks[0]), stacked)


def blocks_of(model: nnx.Module):
  """`model.layers` (stacked) or `model.blocks` (a list), whichever `set_blocks` made."""
  return model.layers if model.cfg.scan_layers else model.blocks


def run_blocks(cfg, blocks, x_BxLxD: jax.Array, segment_ids_BxL=None, positions_BxL=None):
  """x through the blocks (rematerialised as cfg.remat says; one scan with cfg.scan_layers), and
  for a mixture of experts its routing stats (empty when dense): `moe_load_balance`,
  `moe_router_z`, `moe_dropped` and `moe_idle_experts` (the share of experts that took no token)
  averaged over the sparse blocks; `moe_min_load`, the least-loaded expert of any sparse block
  over an even share."""
  if cfg.scan_layers:
    x_BxLxD, s_Nx5 = _scan_blocks(cfg, blocks, x_BxLxD, segment_ids_BxL, positions_BxL)
    sparse_5 = list(s_Nx5) if cfg.num_experts else []
  else:
    sparse_5 = []
    for i, block in enumerate(blocks):
      if cfg.remat == "none":
        x_BxLxD, s_5 = block(x_BxLxD, segment_ids_BxL, positions_BxL)
      else:
        remat = nnx.remat(lambda b, x, s, p: b(x, s, p), policy=REMAT[cfg.remat])
        x_BxLxD, s_5 = remat(block, x_BxLxD, segment_ids_BxL, positions_BxL)
      if cfg.is_moe(i):
        sparse_5.append(s_5)
  if not sparse_5:
    return x_BxLxD, {}
  s_Sx5 = jnp.stack(sparse_5)
  mean_5 = jnp.mean(s_Sx5, axis=0)
  return x_BxLxD, dict(
      moe_load_balance=mean_5[0],
      moe_router_z=mean_5[1],
      moe_dropped=mean_5[2],
      moe_idle_experts=mean_5[3],
      moe_min_load=jnp.min(s_Sx5[:, 4]),
  )


def _scan_blocks(
    cfg, layers, x_BxLxD: jax.Array, segment_ids_BxL=None, positions_BxL=None
) -> tuple[jax.Array, jax.Array]:
  """The blocks as one `jax.lax.scan` over `layers`, the block whose parameters are stacked on a
  leading layer axis (`set_blocks`): one block's program applied N times."""
  graphdef, stacked = nnx.split(layers)

  def body(x_BxLxD, state):
    return nnx.merge(graphdef, state)(x_BxLxD, segment_ids_BxL, positions_BxL)

  if cfg.remat != "none":
    body = jax.checkpoint(body, policy=REMAT[cfg.remat])
  return jax.lax.scan(body, x_BxLxD, stacked)
