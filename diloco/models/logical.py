"""Logical axis names of parameters and activations, and the one table that maps them to mesh axes.

A tensor's dimensions are named by what they are (`embed`, `heads`, `mlp`, `activation_batch`...);
`RULES` says which mesh axis each name is split over. `inner/sharding.py` places parameters by it;
the model constrains its activations by it (`constrain`), so the layouts between the matmuls are
chosen, not left to the compiler's propagation. A mesh axis the island's mesh lacks is dropped
(a mesh without 'tensor' keeps every tensor-parallel dimension whole), so one table serves every
mesh: ('data', 'fsdp'), with 'tensor' for tensor parallelism, with 'expert' for a mixture of
experts.
"""

import jax
from jax.sharding import PartitionSpec as P

DATA, FSDP, TENSOR, EXPERT = "data", "fsdp", "tensor", "expert"

RULES: dict[str, str | tuple[str, ...] | None] = {
    # parameters
    "embed": FSDP,  # the model width of a weight matrix: FSDP (ZeRO-3) shards it
    "embed_vocab": FSDP,  # the token table's rows (its vocabulary), FSDP-sharded
    "embed_table": TENSOR,  # the token table's width
    "heads": TENSOR,  # query heads (and an attention output's)
    "kv_heads": TENSOR,  # key/value heads
    "mlp": TENSOR,  # the MLP's hidden width
    "vocab": TENSOR,  # the output layer's vocabulary
    "expert": EXPERT,  # a mixture of experts' expert dimension
    # activations
    "activation_batch": (DATA, FSDP, EXPERT),  # every batch is split over these
    "activation_length": None,
    "activation_embed": None,
    "activation_heads": TENSOR,
    "activation_kv_heads": TENSOR,
    "activation_mlp": TENSOR,
    "activation_vocab": TENSOR,
}

# The activations' names, as the model writes them.
HIDDEN = ("activation_batch", "activation_length", "activation_embed")  # [B, L, D]
HEADS = ("activation_batch", "activation_length", "activation_heads", None)  # [B, L, H, Dh]
KV_HEADS = ("activation_batch", "activation_length", "activation_kv_heads", None)
MLP = ("activation_batch", "activation_length", "activation_mlp")  # [B, L, F]
LOGITS = ("activation_batch", "activation_length", "activation_vocab")  # [B, L, V]


def spec(names, axis_names) -> P:
  """The PartitionSpec of dimensions `names` on a mesh with `axis_names` (absent axes dropped)."""
  out = []
  for name in names:
    axes = RULES.get(name) if name is not None else None
    if axes is None:
      out.append(None)
      continue
    kept = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if a in axis_names)
    out.append(kept[0] if len(kept) == 1 else (kept or None))
  return P(*out)


def constrain(x: jax.Array, names) -> jax.Array:
  """`x` laid out as `names` say on the mesh the step is traced with (inner/step.py); unchanged
  outside one (a model called on its own) or on a mesh of one device."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return x
  return jax.lax.with_sharding_constraint(x, spec(names, mesh.axis_names))
