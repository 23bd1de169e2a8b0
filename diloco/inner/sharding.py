"""Island meshes and partition rules for parameters, optimizer state and batches.

An island is a mesh ('data', 'fsdp'), with a 'tensor' axis for tensor parallelism and an 'expert'
axis for expert parallelism. Batches are split over 'data', 'fsdp' and 'expert'; each weight
matrix's dimensions carry logical names (PARAM_RULES) that models/logical.py maps to mesh axes:
its model width over 'fsdp' (ZeRO-3 style), its heads or MLP width over 'tensor', a mixture of
experts' expert dimension over 'expert', replicated over 'data' (a rule's axis the mesh lacks is
dropped, so the same rules serve every mesh). Optimizer moments follow the parameters they belong
to, because rules match path suffixes.
Learners stacked on one mesh (inner/stacked.py) add a leading 'learners' axis to all of it.
"""

import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from diloco.models import logical

DATA, FSDP, TENSOR, EXPERT = logical.DATA, logical.FSDP, logical.TENSOR, logical.EXPERT
LEARNERS = "learners"
BATCH_AXES = (DATA, FSDP, EXPERT)

# (regex on the '/'-joined leaf path, the logical names of its dimensions): the first match of the
# leaf's rank wins; unmatched leaves are replicated. models/logical.py maps names to mesh axes.
PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed/embedding$", ("embed_vocab", "embed_table")),  # [V, D]
    (r"attn/qkv$", ("embed", None, "heads", None)),  # [D, 3, H, Dh]
    (r"attn/q$", ("embed", "heads", None)),  # [D, H, Dh] (grouped-query attention)
    (r"attn/kv$", ("embed", None, "kv_heads", None)),  # [D, 2, Hkv, Dh]
    (r"attn/out$", ("heads", None, "embed")),  # [H, Dh, D]
    (r"mlp/wi$", ("embed", "mlp")),  # [D, F] (gelu)
    (r"mlp/wi$", ("embed", None, "mlp")),  # [D, 2, F] (swiglu)
    (r"mlp/wo$", ("mlp", "embed")),  # [F, D]
    (r"moe/wi$", ("expert", None, None)),  # [E, D, F]
    (r"moe/wi$", ("expert", None, None, None)),  # [E, D, 2, F]
    (r"moe/wo$", ("expert", None, None)),  # [E, F, D]
    (r"unembed/kernel$", ("embed", "vocab")),  # [D, V]
)


STACKED = r"(^|/)layers/"  # the stacked blocks' leaves (and their optimizer state's)


def _tile(n: int, data: int, fsdp: int) -> tuple[int, int]:
  """(data, fsdp) sizes that tile n devices; -1 takes what is left (both -1: fsdp takes all)."""
  if data == -1 and fsdp == -1:
    data = 1
  if data == -1:
    data = n // fsdp if fsdp > 0 else 0
  if fsdp == -1:
    fsdp = n // data if data > 0 else 0
  if data <= 0 or fsdp <= 0 or data * fsdp != n:
    raise ValueError(f"mesh data={data} x fsdp={fsdp} does not tile {n} devices")
  return data, fsdp


def make_island_mesh(
    devices: Sequence[jax.Device], data: int = -1, fsdp: int = 1, expert: int = 1, tensor: int = 1
) -> Mesh:
  """A ('data', 'fsdp') mesh over exactly these devices, with a 'tensor' axis when tensor > 1 and
  an 'expert' axis when expert > 1; -1 takes what is left."""
  shape, names = island_shape(len(devices), data, fsdp, expert, tensor)
  auto = (jax.sharding.AxisType.Auto,) * len(names)  # the compiler propagates shardings
  return jax.make_mesh(shape, names, axis_types=auto, devices=list(devices))


def island_shape(
    n: int, data: int = -1, fsdp: int = 1, expert: int = 1, tensor: int = 1
) -> tuple[tuple[int, ...], tuple[str, ...]]:
  """The shape and axis names of an island's mesh over n devices (`make_island_mesh`)."""
  if expert < 1 or n % expert:
    raise ValueError(f"mesh.expert={expert} does not divide {n} devices")
  if tensor < 1 or (n // expert) % tensor:
    raise ValueError(f"mesh.tensor={tensor} does not divide {n // expert} devices")
  shape, names = _tile(n // expert // tensor, data, fsdp), (DATA, FSDP)
  if tensor > 1:
    shape, names = (*shape, tensor), (*names, TENSOR)
  if expert > 1:
    shape, names = (*shape, expert), (*names, EXPERT)
  return shape, names


def make_stacked_mesh(
    devices: Sequence[jax.Device], learners: int, data: int = -1, fsdp: int = 1
) -> Mesh:
  """A ('learners', 'data', 'fsdp') mesh: row i (len(devices) // learners devices, in order)
  holds the i-th block of stacked learners, split like an island."""
  if learners <= 0 or len(devices) % learners:
    raise ValueError(f"{len(devices)} devices do not split into {learners} rows of learners")
  shape = (learners, *_tile(len(devices) // learners, data, fsdp))
  grid = np.asarray(list(devices), dtype=object).reshape(shape)
  return Mesh(grid, (LEARNERS, DATA, FSDP), axis_types=(jax.sharding.AxisType.Auto,) * 3)


def path_str(path) -> str:
  """'/'-joined key path of a pytree leaf: blocks/0/attn/qkv."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh) -> P:
  """The partition spec of one leaf; a dimension the mesh axis does not divide is refused. A
  leaf of the stacked blocks (`layers/...`, model.scan_layers) is its block's leaf with a leading
  layer axis, kept whole."""
  if re.search(STACKED, path) and shape:
    return P(None, *spec_for(re.sub(STACKED, r"\1blocks/0/", path, count=1), shape[1:], mesh))
  for pattern, names in PARAM_RULES:
    if re.search(pattern, path) and len(shape) == len(names):
      spec = logical.spec(names, mesh.axis_names)
      size = dict(mesh.shape)
      for dim, axis in zip(shape, spec):
        if axis is not None and dim % size[axis]:
          raise ValueError(
              f"{path} has shape {shape}: dimension {dim} is not divisible by mesh axis"
              f" {axis!r} of size {size[axis]}; change the model or mesh.{axis}"
          )
      return spec
  return P()


def tree_shardings(tree, mesh: Mesh, lead: tuple[str, ...] = ()):
  """NamedShardings for a params-like tree (params, optimizer state, abstract state); `lead`
  names the mesh axes of leading dimensions the rules do not see (stacked learners: 'learners')."""

  def one(path, leaf):
    shape = tuple(np.shape(leaf))[len(lead) :]
    return NamedSharding(mesh, P(*lead, *spec_for(path_str(path), shape, mesh)))

  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh: Mesh, ndim: int = 2, lead: tuple[str, ...] = ()) -> NamedSharding:
  """A batch array ([B, L] tokens, [B, H, W, C] images, [B] labels) split along B over every
  device of the island; `lead` names leading mesh axes (stacked learners: 'learners')."""
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  return NamedSharding(mesh, P(*lead, axes, *(None,) * (ndim - 1)))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
