"""The scanned model's stacked blocks seen as the loop's blocks, and checkpoints converted between
the two forms.

With `model.scan_layers` the blocks' parameters are stored stacked on a leading layer axis under
`layers/` (`layers/attn/q` is [N, D, H, Dh]); without it each block's are under `blocks/{i}/`. The
outer loop (fragments, the synchronizer, uploads, their checkpoints) sees one form only, the
loop's: `expand` turns a flat path dict of the stacked form into `blocks/{i}/...` views, one per
layer, and `collapse` stacks such views back. A train state (parameters and the optimizer state
that mirrors them) converts as a whole with `stack` and `unstack`, which is how a checkpoint of
one form loads into the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

STACKED, BLOCKS, SEP = "layers", "blocks", "/"


def is_stacked_path(path: str) -> bool:
  return path.split(SEP, 1)[0] == STACKED


def take(x: Any, i: int) -> Any:
  """Layer i of a stacked leaf: an array's slice, a shape's or a sharding's without the layer axis."""
  if isinstance(x, NamedSharding):
    return NamedSharding(x.mesh, PartitionSpec(*tuple(x.spec)[1:]))
  if isinstance(x, jax.ShapeDtypeStruct):
    sharding = take(x.sharding, i) if isinstance(x.sharding, NamedSharding) else None
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sharding)
  if not hasattr(x, "shape") or not x.shape:
    raise ValueError(f"a stacked leaf needs a leading layer axis, got {type(x).__name__}")
  return x[i]


def put(parts: list, like: Any) -> Any:
  """The per-layer `parts` stacked into one leaf of `like`'s kind (and sharding)."""
  first = parts[0]
  if isinstance(first, NamedSharding):
    return NamedSharding(first.mesh, PartitionSpec(None, *first.spec))
  if isinstance(first, jax.ShapeDtypeStruct):
    sharding = put([first.sharding], None) if isinstance(first.sharding, NamedSharding) else None
    return jax.ShapeDtypeStruct((len(parts), *first.shape), first.dtype, sharding=sharding)
  if not isinstance(like, jax.Array) and not any(isinstance(p, jax.Array) for p in parts):
    return np.stack(parts)
  out = jnp.stack(parts)
  placed = isinstance(like, jax.Array) and not isinstance(like, jax.core.Tracer)
  return jax.device_put(out, like.sharding) if placed else out


def num_layers(flat: Mapping[str, Any]) -> int:
  """Layers of a flat dict's stacked leaves (0 if it has none)."""
  sizes = {int(v.shape[0]) for k, v in flat.items() if is_stacked_path(k)}
  if len(sizes) > 1:
    raise ValueError(f"stacked leaves disagree on the number of layers: {sorted(sizes)}")
  return sizes.pop() if sizes else 0


def view_paths(flat: Mapping[str, Any]) -> list[str]:
  """`flat`'s paths with each `layers/<leaf>` replaced by `blocks/{i}/<leaf>` for every layer i
  (nothing is sliced)."""
  n, out = num_layers(flat), []
  for path in flat:
    if is_stacked_path(path):
      leaf = path.split(SEP, 1)[1]
      out += [f"{BLOCKS}{SEP}{i}{SEP}{leaf}" for i in range(n)]
    else:
      out.append(path)
  return out


def expand(flat: Mapping[str, Any]) -> dict[str, Any]:
  """`flat` with each stacked leaf replaced by its per-layer views (`view_paths`)."""
  return {p: flat[p] if p in flat else read(flat, p) for p in view_paths(flat)}


def collapse(flat: Mapping[str, Any], like: Mapping[str, Any]) -> dict[str, Any]:
  """`expand`'s inverse: the `blocks/{i}/<leaf>` entries of `flat` stacked into the leaves of
  `like` (a flat dict of the stacked form) that they view; other entries as they are."""
  out = {k: v for k, v in flat.items() if not k.startswith(BLOCKS + SEP)}
  n = num_layers(like)
  for path, old in like.items():
    if is_stacked_path(path):
      leaf = path.split(SEP, 1)[1]
      out[path] = put([flat[f"{BLOCKS}{SEP}{i}{SEP}{leaf}"] for i in range(n)], old)
  return out


def view_of(path: str) -> tuple[str, int]:
  """(the stacked leaf's path, the layer) that `blocks/{i}/<leaf>` views."""
  view = _view_of(path)
  if view is None:
    raise KeyError(f"{path!r} is neither a leaf nor a view of a stacked leaf")
  return view


def _view_of(path: str) -> tuple[str, int] | None:
  top, _, rest = path.partition(SEP)
  index, _, leaf = rest.partition(SEP)
  if top != BLOCKS or not index.isdigit() or not leaf:
    return None
  return f"{STACKED}{SEP}{leaf}", int(index)


def read(flat: Mapping[str, Any], path: str) -> Any:
  """The view `path` (`blocks/{i}/<leaf>`) of a flat dict of the stacked form."""
  source, i = view_of(path)
  if source not in flat:
    raise KeyError(f"{path!r} is neither a leaf nor a view of a stacked leaf")
  return take(flat[source], i)


def write(flat: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
  """The leaves of `flat` (the stacked form) that `values` change: each stacked leaf that a view
  in `values` falls in, with those layers replaced; values of other leaves as they are."""
  out, layers = {}, {}
  for path, value in values.items():
    view = _view_of(path)
    if view is None or view[0] not in flat:
      out[path] = value
    else:
      layers.setdefault(view[0], {})[view[1]] = value
  for path, new in layers.items():
    old = flat[path]
    parts = [new[i] if i in new else take(old, i) for i in range(int(old.shape[0]))]
    out[path] = put(parts, old)
  return out


def _is_blocks(node: Any) -> bool:
  return (
      isinstance(node, Mapping)
      and bool(node)
      and all(str(k).isdigit() for k in node)
      and all(isinstance(v, Mapping) for v in node.values())
  )


def _map_nodes(tree: Any, fn) -> Any:
  """`tree` rebuilt bottom-up with `fn` applied to every mapping (containers kept by type)."""
  if isinstance(tree, Mapping):
    return fn(type(tree)({k: _map_nodes(v, fn) for k, v in tree.items()}))
  if isinstance(tree, tuple) and hasattr(tree, "_fields"):
    return type(tree)(*(_map_nodes(v, fn) for v in tree))
  if isinstance(tree, (tuple, list)):
    return type(tree)(_map_nodes(v, fn) for v in tree)
  return tree


def stack(tree: Any) -> Any:
  """A train state (or any pytree of pure dicts) of the loop's form in the stacked form: every
  `blocks: {0: ..., 1: ...}` becomes `layers: ...` with the blocks' leaves stacked."""

  def one(node: Mapping) -> Mapping:
    if BLOCKS not in node or not _is_blocks(node[BLOCKS]):
      return node
    blocks = node[BLOCKS]
    order = sorted(blocks, key=lambda k: int(k))
    if [int(k) for k in order] != list(range(len(order))):
      raise ValueError(f"blocks {order} are not numbered 0..{len(order) - 1}")
    per = [blocks[k] for k in order]
    structure = jax.tree.structure(per[0])
    if any(jax.tree.structure(p) != structure for p in per):
      raise ValueError("blocks of different kinds (dense and sparse) cannot be stacked")
    leaves = [jax.tree.leaves(p) for p in per]
    stacked = [put(list(parts), None) for parts in zip(*leaves)]
    rest = {k: v for k, v in node.items() if k != BLOCKS}
    return type(node)({**rest, STACKED: jax.tree.unflatten(structure, stacked)})

  return _map_nodes(tree, one)


def unstack(tree: Any) -> Any:
  """`stack`'s inverse: every `layers: ...` node becomes `blocks: {0: ..., 1: ...}` (int keys,
  as a loop model's state has them)."""

  def one(node: Mapping) -> Mapping:
    if STACKED not in node or not isinstance(node[STACKED], Mapping):
      return node
    layers = node[STACKED]
    leaves, structure = jax.tree.flatten(layers)
    n = {int(x.shape[0]) for x in leaves}
    if len(n) != 1:
      raise ValueError(f"stacked leaves disagree on the number of layers: {sorted(n)}")
    blocks = {
        i: jax.tree.unflatten(structure, [take(x, i) for x in leaves]) for i in range(n.pop())
    }
    rest = {k: v for k, v in node.items() if k != STACKED}
    return type(node)({**rest, BLOCKS: blocks})

  return _map_nodes(tree, one)


def other_form(tree: Any) -> Any | None:
  """`tree` in the other form (stacked <-> per block), or None if it holds no blocks at all."""
  found = set()

  def seen(node: Mapping) -> Mapping:
    if STACKED in node and isinstance(node[STACKED], Mapping):
      found.add(STACKED)
    if BLOCKS in node and _is_blocks(node[BLOCKS]):
      found.add(BLOCKS)
    return node

  _map_nodes(tree, seen)
  if found == {STACKED}:
    return unstack(tree)
  if found == {BLOCKS}:
    return stack(tree)
  return None
