"""Island meshes and partition rules for parameters, optimizer state and batches.

An island is a 2-D mesh ('data', 'fsdp'), or 3-D ('data', 'fsdp', 'expert') for expert
parallelism. Batches are split over every axis; each weight matrix is split over 'fsdp' along the
dimension named in the rules below (ZeRO-3 style), and replicated over 'data'; a mixture of
experts' weights are split over 'expert' along their expert dimension (a rule's axis the mesh
lacks is dropped, so the same rules serve every mesh). Optimizer moments follow the parameters they belong to, because rules match path suffixes.
Learners stacked on one mesh (inner/stacked.py) add a leading 'learners' axis to all of it.
"""

import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA, FSDP, EXPERT, LEARNERS = "data", "fsdp", "expert", "learners"
BATCH_AXES = (DATA, FSDP, EXPERT)

# (regex on the '/'-joined leaf path, spec). The first match wins; unmatched leaves are replicated.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"embed/embedding$", P(FSDP, None)),  # [V, D]
    (r"attn/qkv$", P(FSDP, None, None, None)),  # [D, 3, H, Dh]
    (r"attn/q$", P(FSDP, None, None)),  # [D, H, Dh] (grouped-query attention)
    (r"attn/kv$", P(FSDP, None, None, None)),  # [D, 2, Hkv, Dh]
    (r"attn/out$", P(None, None, FSDP)),  # [H, Dh, D]
    (r"mlp/wi$", P(FSDP)),  # [D, F] or [D, 2, F]
    (r"mlp/wo$", P(None, FSDP)),  # [F, D]
    (r"moe/wi$", P(EXPERT)),  # [E, D, F] or [E, D, 2, F]
    (r"moe/wo$", P(EXPERT)),  # [E, F, D]
    (r"unembed/kernel$", P(FSDP, None)),  # [D, V]
)


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
    devices: Sequence[jax.Device], data: int = -1, fsdp: int = 1, expert: int = 1
) -> Mesh:
  """A ('data', 'fsdp') mesh over exactly these devices, with an 'expert' axis when expert > 1;
  -1 takes what is left."""
  shape, names = island_shape(len(devices), data, fsdp, expert)
  auto = (jax.sharding.AxisType.Auto,) * len(names)  # the compiler propagates shardings
  return jax.make_mesh(shape, names, axis_types=auto, devices=list(devices))


def island_shape(
    n: int, data: int = -1, fsdp: int = 1, expert: int = 1
) -> tuple[tuple[int, ...], tuple[str, ...]]:
  """The shape and axis names of an island's mesh over n devices (`make_island_mesh`)."""
  if expert < 1 or n % expert:
    raise ValueError(f"mesh.expert={expert} does not divide {n} devices")
  shape, names = _tile(n // expert, data, fsdp), (DATA, FSDP)
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
  """The partition spec of one leaf; a dimension that does not divide falls back to replicated."""
  for pattern, spec in PARAM_RULES:
    if re.search(pattern, path) and len(shape) >= len(spec):
      spec = P(*(a if a in mesh.axis_names else None for a in spec))
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
