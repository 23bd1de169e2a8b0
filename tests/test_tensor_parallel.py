"""Tensor parallelism with logical axes (models/logical.py, inner/sharding.py): parameters split
over 'tensor' by their logical names, activations constrained, the same loss as one device, and
no all-gather of the batch's hidden states or logits in the compiled step."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from diloco.inner import checkpoint, sharding, step as step_lib
from diloco.models import logical, transformer as tr

CFG = tr.ModelConfig(
    vocab_size=256, d_model=64, num_layers=2, num_heads=4, d_ff=128, max_len=64, attention="einsum"
)
OPT = step_lib.OptimizerConfig(warmup_steps=0, decay_steps=0)
B, L = 8, 64


def _batch():
  tokens = np.random.default_rng(0).integers(0, 256, (B, L + 1)).astype(np.int32)
  return {"inputs_BxL": tokens[:, :-1], "targets_BxL": tokens[:, 1:]}


def test_parameters_split_by_their_logical_names_and_the_loss_is_one_devices():
  mesh = sharding.make_island_mesh(jax.devices()[:8], data=1, fsdp=4, tensor=2)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
  fns = step_lib.build_step_fns(CFG, OPT, mesh)
  specs = {
      sharding.path_str(p): s.spec
      for p, s in jax.tree_util.tree_leaves_with_path(fns.state_shardings.params)
  }
  assert specs["blocks/0/attn/qkv"] == P("fsdp", None, "tensor", None)
  assert specs["blocks/0/attn/out"] == P("tensor", None, "fsdp")
  assert specs["blocks/0/mlp/wi"] == P("fsdp", None, "tensor")  # [D, 2, F]
  assert specs["blocks/0/mlp/wo"] == P("tensor", "fsdp")
  assert specs["embed/embedding"] == P("fsdp", "tensor")
  # scanned: each stacked leaf its block's spec behind a whole layer axis, its AdamW moments too
  scanned = step_lib.build_step_fns(tr.ModelConfig(**{**vars(CFG), "scan_layers": True}), OPT, mesh)
  specs = {
      sharding.path_str(p): s.spec
      for p, s in jax.tree_util.tree_leaves_with_path(scanned.state_shardings)
  }
  assert specs["params/layers/attn/qkv"] == P(None, "fsdp", None, "tensor", None)
  assert specs["opt_state/1/0/mu/layers/mlp/wo"] == P(None, "tensor", "fsdp")
  one = step_lib.build_step_fns(CFG, OPT, sharding.make_island_mesh(jax.devices()[:1]))
  losses = []
  for f in (fns, one):
    state = f.init(jax.random.key(0))
    state, m = f.train(state, step_lib.put_batch(_batch(), f.mesh))
    losses.append(float(m["loss"]))
    _, m = f.train(state, step_lib.put_batch(_batch(), f.mesh))
    losses.append(float(m["loss"]))
  assert losses[0] == pytest.approx(losses[2], abs=1e-5)  # the first step: the same model
  assert losses[1] == pytest.approx(losses[3], abs=1e-4)  # after one update on either mesh


def _batch_gathers(cfg, fsdp: int, tensor: int) -> tuple[list[str], list[str]]:
  """The shapes the compiled train step all-gathers: all of them, and those of a batch's
  activations ([B, L, ...]: hidden states, logits, their per-position reductions)."""
  mesh = sharding.make_island_mesh(jax.devices()[:8], data=1, fsdp=fsdp, tensor=tensor)
  fns = step_lib.build_step_fns(cfg, OPT, mesh)
  state = checkpoint.abstract_like(jax.eval_shape(fns.init, jax.random.key(0)), fns.state_shardings)
  batch = {
      k: jax.ShapeDtypeStruct((B, L), jnp.int32, sharding=sharding.batch_sharding(mesh, 2))
      for k in ("inputs_BxL", "targets_BxL")
  }
  hlo = fns.train.lower(state, batch).compile().as_text()
  gathered = re.findall(r"= (\w+\[[\d,]*\])\S* all-gather", hlo)
  return gathered, [g for g in gathered if re.search(rf"\[{B},{L}(,|\])", g)]


@pytest.mark.parametrize(
    "tied,fsdp,tensor", [(True, 8, 1), (False, 4, 2)], ids=["tied_fsdp8", "untied_fsdp4_tensor2"]
)
def test_the_compiled_step_never_gathers_the_batchs_hidden_states_or_logits(
    tied, fsdp, tensor, monkeypatch
):
  # the large presets' defaults: bf16 compute, blocks scanned
  step_lib.pure_fns.cache_clear(), step_lib.build_step_fns.cache_clear()
  cfg = tr.ModelConfig(
      **{**vars(CFG), "tied_embeddings": tied, "dtype": "bfloat16", "scan_layers": True}
  )
  gathered, activations = _batch_gathers(cfg, fsdp, tensor)
  assert gathered, "an FSDP step gathers its weights"
  assert not activations, activations  # every gather is of a weight
  # the control: left to the compiler's propagation, the same step gathers a batch's activations
  # onto every device: the hidden states f32[8,64,64] (tied, fsdp=8), the MLP's f32[8,64,128]
  # (fsdp=4, tensor=2)
  monkeypatch.setattr(logical, "constrain", lambda x, names: x)
  step_lib.pure_fns.cache_clear(), step_lib.build_step_fns.cache_clear()  # traced anew
  _, unconstrained = _batch_gathers(cfg, fsdp, tensor)
  wide = {f"f32[{B},{L},{n}]" for n in (CFG.d_model, CFG.d_ff, CFG.vocab_size)}
  assert wide & set(unconstrained), unconstrained
