"""Cutting a params tree into P fragments, and the step at which each fragment syncs.

A params tree is a nested dict of arrays (``nnx.State.to_pure_dict()``); transformer blocks sit
under ``'blocks'`` keyed by ints or digit strings. A leaf's path is its keys joined by '/', e.g.
``'blocks/3/attn/qkv/kernel'``. Learners and the synchronizer exchange path-keyed flat dicts; every
function here accepts either form. Fragment ids are 0..P-1, and which leaf goes where depends only
on the sorted path strings and the shapes and dtypes, never on dict insertion order.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from diloco.models import layer_stack

SEP = "/"
KINDS = ("strided", "balanced")
EMBED_KEY = "embed"

Params = Mapping[Any, Any]  # nested dict of arrays, or a path-keyed flat dict


def _key_str(key: Any) -> str:
  if isinstance(key, (bool, np.bool_)) or not isinstance(key, (str, int, np.integer)):
    raise ValueError(f"params keys must be str or int, got {key!r} ({type(key).__name__})")
  s = str(key)
  if not s or SEP in s:
    raise ValueError(f"params key {key!r} is empty or contains {SEP!r}")
  return s


def _walk(node: Mapping, prefix: str, out: dict[str, Any]) -> None:
  for key, value in node.items():
    path = prefix + _key_str(key)
    if isinstance(value, Mapping):
      _walk(value, path + SEP, out)
    elif path in out:
      raise ValueError(f"two leaves map to the path {path!r} (e.g. keys 0 and '0')")
    else:
      out[path] = value


def is_flat(params: Params) -> bool:
  """True if no value is a dict, i.e. ``params`` is already path-keyed (or one level deep)."""
  return not any(isinstance(v, Mapping) for v in params.values())


def flatten(params: Params, view: bool = True) -> dict[str, Any]:
  """Path-keyed flat dict of the leaves, sorted by path (a flat dict comes back re-sorted). A
  scanned model's stacked blocks (`layers/...`) come as the loop's `blocks/{i}/...`, one view per
  layer (models/layer_stack.py), unless `view` is False."""
  out = _flatten(params)
  if view and any(layer_stack.is_stacked_path(k) for k in out):
    return dict(sorted(layer_stack.expand(out).items()))
  return out


def _flatten(params: Params) -> dict[str, Any]:
  if not isinstance(params, Mapping):
    raise ValueError(f"params must be a dict, got {type(params).__name__}")
  if is_flat(params):
    for key in params:
      if not isinstance(key, str) or not key:
        raise ValueError(f"flat params keys must be non-empty path strings, got {key!r}")
    return dict(sorted(params.items()))
  out: dict[str, Any] = {}
  _walk(params, "", out)
  return dict(sorted(out.items()))


def leaf_paths(params: Params) -> list[str]:
  """Sorted leaf paths (a stacked leaf's views by name: nothing is sliced)."""
  return sorted(layer_stack.view_paths(flatten(params, view=False)))


def _check_same_paths(have: Sequence[str], want: Sequence[str], what: str) -> None:
  missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
  if missing or extra:
    raise ValueError(
        f"{what}: missing paths {missing[:5]}{'...' if len(missing) > 5 else ''}, "
        f"extra paths {extra[:5]}{'...' if len(extra) > 5 else ''}"
    )


def unflatten(flat: Mapping[str, Any], like: Params | None = None) -> Params:
  """Nested dict from a flat one; with ``like``, its structure and key types (int/str) are kept.

  ``like`` that is itself flat gives a flat dict. Without ``like``, keys stay strings.
  """
  if like is None:
    root: dict[str, Any] = {}
    for path, value in sorted(flat.items()):
      *parents, leaf = path.split(SEP)
      node = root
      for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
          raise ValueError(f"path {path!r} passes through a leaf")
      node[leaf] = value
    return root
  _check_same_paths(list(flat), leaf_paths(like), "unflatten")
  raw = flatten(like, view=False)
  if any(layer_stack.is_stacked_path(k) for k in raw):
    flat = layer_stack.collapse(flat, raw)
  if is_flat(like):
    return {path: flat[path] for path in like}
  return _rebuild(like, "", flat, prefixes=None)


def leaves(params: Params, paths: Sequence[str]) -> dict[str, Any]:
  """The leaves at `paths` (views of the stacked blocks sliced one by one, not all of them)."""
  raw = flatten(params, view=False)
  return {k: raw[k] if k in raw else layer_stack.read(raw, k) for k in paths}


def _rebuild(
    node: Mapping, prefix: str, flat: Mapping[str, Any], prefixes: set[str] | None
) -> dict:
  """Copy of ``node`` with leaves from ``flat``; subtrees outside ``prefixes`` are shared."""
  out = {}
  for key, value in node.items():
    path = prefix + _key_str(key)
    if isinstance(value, Mapping):
      if prefixes is None or path in prefixes:
        out[key] = _rebuild(value, path + SEP, flat, prefixes)
      else:
        out[key] = value
    else:
      out[key] = flat[path] if path in flat else value
  return out


def leaf_nbytes(x: Any) -> int:
  """Bytes of an array-like leaf (numpy, jax, ShapeDtypeStruct)."""
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise ValueError(f"leaf is not an array: {type(x).__name__}")
  return math.prod(x.shape) * np.dtype(x.dtype).itemsize


def is_embedding(path: str) -> bool:
  """True for the token-embedding leaves (under 'embed'), always merged by plain mean."""
  return path.split(SEP, 1)[0] == EMBED_KEY


def embedding_paths(params: Params) -> list[str]:
  """Sorted paths of the embedding leaves."""
  return [p for p in leaf_paths(params) if is_embedding(p)]


@dataclasses.dataclass(frozen=True)
class Fragmentation:
  """Fragment p -> its sorted leaf paths; every leaf in exactly one non-empty fragment."""

  num_fragments: int
  paths: tuple[tuple[str, ...], ...]
  kind: str
  _index: dict[str, int] = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.num_fragments < 1 or len(self.paths) != self.num_fragments:
      raise ValueError(
          f"need num_fragments >= 1 path groups, got num_fragments="
          f"{self.num_fragments} and {len(self.paths)} groups"
      )
    index: dict[str, int] = {}
    for p, group in enumerate(self.paths):
      if not group:
        raise ValueError(f"fragment {p} of {self.num_fragments} is empty")
      if list(group) != sorted(group):
        raise ValueError(f"fragment {p} paths are not sorted")
      for path in group:
        if path in index:
          raise ValueError(f"path {path!r} is in fragments {index[path]} and {p}")
        index[path] = p
    object.__setattr__(self, "_index", index)

  @property
  def all_paths(self) -> list[str]:
    return sorted(self._index)

  def fragment_of(self, path: str) -> int:
    try:
      return self._index[path]
    except KeyError:
      raise ValueError(f"path {path!r} is in no fragment") from None

  def nbytes(self, p: int, params: Params) -> int:
    """Bytes of fragment p's leaves in ``params``."""
    return sum(leaf_nbytes(x) for x in extract(params, self, p).values())

  def check(self, params: Params) -> None:
    """ValueError unless ``params`` has exactly this fragmentation's leaves."""
    _check_same_paths(leaf_paths(params), self.all_paths, f"{self.kind} fragmentation vs params")


def _check_p(num_fragments: int) -> None:
  if not isinstance(num_fragments, (int, np.integer)) or num_fragments < 1:
    raise ValueError(f"num_fragments must be a positive integer, got {num_fragments!r}")


def _group(assign: Mapping[str, int], num_fragments: int, kind: str) -> Fragmentation:
  groups: list[list[str]] = [[] for _ in range(num_fragments)]
  for path in sorted(assign):
    groups[assign[path]].append(path)
  return Fragmentation(num_fragments, tuple(tuple(g) for g in groups), kind)


def strided(
    params: Params,
    num_fragments: int,
    *,
    blocks_key: str = "blocks",
    first: Sequence[str] = ("embed", "patch", "cls"),  # the decoder's and the ViT's inputs
    last: Sequence[str] = ("final_norm", "unembed", "head"),
) -> Fragmentation:
  """Block i -> fragment i mod P (Streaming DiLoCo); ``first`` keys -> 0, ``last`` keys -> P-1.

  Top-level keys are placed explicitly: the embedding goes with the first blocks and the final
  norm and unembedding with the last, so no leaf lands anywhere by accident; any other top-level
  key is a ValueError (pass it in ``first`` or ``last``). P must not exceed the number of blocks
  (a fragment would hold no block); P=1 puts everything in fragment 0.
  """
  _check_p(num_fragments)
  assign: dict[str, int] = {}
  blocks: set[int] = set()
  for path in leaf_paths(params):
    top, *rest = path.split(SEP)
    if top == blocks_key:
      if not rest or not rest[0].isdigit():
        raise ValueError(f"block keys must be ints or digit strings, got path {path!r}")
      blocks.add(int(rest[0]))
      assign[path] = int(rest[0]) % num_fragments
    elif top in first:
      assign[path] = 0
    elif top in last:
      assign[path] = num_fragments - 1
    else:
      raise ValueError(
          f"strided: top-level key {top!r} is neither {blocks_key!r} nor in "
          f"first={tuple(first)} or last={tuple(last)}"
      )
  if num_fragments > 1 and num_fragments > len(blocks):
    raise ValueError(f"strided: {num_fragments} fragments but only {len(blocks)} blocks")
  return _group(assign, num_fragments, "strided")


def balanced(params: Params, num_fragments: int) -> Fragmentation:
  """Greedy bin-packing: leaves by bytes descending (ties by path), each into the lightest bin.

  Ties between bins go to the one with fewer leaves, then the lowest index (so zero-size leaves
  cannot leave a bin empty). The heaviest and lightest bins differ by at most the largest leaf.
  """
  _check_p(num_fragments)
  flat = flatten(params)
  if num_fragments > len(flat):
    raise ValueError(f"balanced: {num_fragments} fragments but only {len(flat)} leaves")
  order = sorted(flat, key=lambda path: (-leaf_nbytes(flat[path]), path))
  heap = [(0, 0, p) for p in range(num_fragments)]  # (bytes, leaves, index)
  assign: dict[str, int] = {}
  for path in order:
    load, count, p = heapq.heappop(heap)
    assign[path] = p
    heapq.heappush(heap, (load + leaf_nbytes(flat[path]), count + 1, p))
  return _group(assign, num_fragments, "balanced")


def make(kind: str, params: Params, num_fragments: int) -> Fragmentation:
  """``strided`` or ``balanced`` by name."""
  if kind == "strided":
    return strided(params, num_fragments)
  if kind == "balanced":
    return balanced(params, num_fragments)
  raise ValueError(f"unknown fragmentation kind {kind!r}; expected one of {KINDS}")


def extract(params: Params, frag: Fragmentation, p: int) -> dict[str, Any]:
  """Fragment p's leaves as a path-keyed flat dict (the arrays themselves, not copies)."""
  _check_index(frag, p)
  flat = flatten(params)
  missing = [path for path in frag.paths[p] if path not in flat]
  if missing:
    raise ValueError(f"fragment {p}: params lack paths {missing[:5]}")
  return {path: flat[path] for path in frag.paths[p]}


def insert(params: Params, frag: Fragmentation, p: int, values: Mapping[str, Any]) -> Params:
  """New params (same form as ``params``) with fragment p set to ``values``; inputs untouched.

  ``values`` must hold exactly fragment p's paths, each with the shape and dtype it replaces.
  Subtrees that hold no leaf of fragment p are shared with ``params``, not copied.
  """
  _check_index(frag, p)
  _check_same_paths(list(values), frag.paths[p], f"insert into fragment {p}")
  old = extract(params, frag, p)
  for path, new in values.items():
    if not hasattr(new, "shape") or not hasattr(new, "dtype"):
      raise ValueError(f"insert {path!r}: value is not an array ({type(new).__name__})")
    if tuple(new.shape) != tuple(old[path].shape):
      raise ValueError(f"insert {path!r}: shape {tuple(new.shape)} != {tuple(old[path].shape)}")
    if np.dtype(new.dtype) != np.dtype(old[path].dtype):
      raise ValueError(
          f"insert {path!r}: dtype {np.dtype(new.dtype)} != {np.dtype(old[path].dtype)}"
      )
  return replace(params, values)


def replace(params: Params, values: Mapping[str, Any]) -> Params:
  """New params (same form as ``params``) with the leaves at ``values``' paths replaced (views of
  stacked blocks included: only the stacked leaves they fall in are rebuilt); inputs untouched."""
  raw = flatten(params, view=False)
  if any(layer_stack.is_stacked_path(k) for k in raw):
    values = layer_stack.write(raw, values)
  if is_flat(params):
    return {**params, **values}
  prefixes = {path.rsplit(SEP, k)[0] for path in values for k in range(1, path.count(SEP) + 1)}
  return _rebuild(params, "", values, prefixes)


def _check_index(frag: Fragmentation, p: int) -> None:
  if not isinstance(p, (int, np.integer)) or not 0 <= p < frag.num_fragments:
    raise ValueError(f"fragment index {p!r} out of range 0..{frag.num_fragments - 1}")


@dataclasses.dataclass(frozen=True)
class Schedule:
  """When each fragment syncs: fragment p at inner steps t >= 1 with (t - t_p) mod H == 0.

  Step t counts completed inner steps (t = 1 after the first), so with P=1 fragment 0 syncs at
  H, 2H, ...; fragment p's offset is t_p = p·H // P, and its first sync comes after t_p steps
  (or H when t_p = 0). Every fragment syncs exactly once in any H consecutive steps; with P > H
  several fragments share a step.
  """

  num_fragments: int
  inner_steps: int

  def __post_init__(self):
    _check_p(self.num_fragments)
    if not isinstance(self.inner_steps, (int, np.integer)) or self.inner_steps < 1:
      raise ValueError(f"inner_steps must be a positive integer, got {self.inner_steps!r}")

  def offset(self, p: int) -> int:
    if not 0 <= p < self.num_fragments:
      raise ValueError(f"fragment index {p!r} out of range 0..{self.num_fragments - 1}")
    return p * self.inner_steps // self.num_fragments

  def syncs_at(self, t: int) -> list[int]:
    """Fragments that sync once t inner steps are done (none at t = 0)."""
    if t < 0:
      raise ValueError(f"step must be >= 0, got {t}")
    if t == 0:
      return []
    h = self.inner_steps
    return [p for p in range(self.num_fragments) if (t - self.offset(p)) % h == 0]

  def interval(self) -> int:
    """The largest k with every sync step a multiple of k: gcd(H, t_1, ..., t_{P-1})."""
    return math.gcd(self.inner_steps, *(self.offset(p) for p in range(self.num_fragments)))

  def next_sync(self, p: int, t: int) -> int:
    """The first step strictly after t at which fragment p syncs."""
    if t < 0:
      raise ValueError(f"step must be >= 0, got {t}")
    h, off = self.inner_steps, self.offset(p)
    return t + 1 + (off - t - 1) % h
