"""The synchronizer's durable state: one record per fragment, and all of it as flat arrays plus
JSON metadata (what a checkpoint holds), and its digest.

`state_dict(sync)` is what a checkpoint saves and a restart loads (its arrays are the
synchronizer's own, not copies: outer/sync/commit.py never writes into them): per fragment the global values,
the downlink residuals and the outer optimizer state's leaves (named `global.p.i`, `residual.p.i`,
`opt.p.i`, i in the fragment's sorted path order or the optimizer's leaf order), the versions, and
as metadata the generation and its lineage, who contributed on which base, the outlier screen's
norm history, the members, the EMAs behind the grace window, and the work merged: each learner's
inner steps and tokens in the uploads each fragment merged.
"""

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax


@dataclasses.dataclass
class FragmentState:
  """Fragment p's durable state, owned by the synchronizer: what a restart must get back."""

  values: dict[str, np.ndarray]  # the global values Θ_p, float32, by path
  opt_state: Any  # the outer optimizer's state for Θ_p
  residual: dict[str, np.ndarray]  # the downlink codec's error feedback, by path
  version: int = 0  # merges committed
  contributed: dict[int, int] = dataclasses.field(default_factory=dict)  # m -> last merged base
  # m -> (its last merged upload's `Upload.key`..., the version that merged it): a learner that
  # joins without that version is told its upload is in what it gets (`Send.own`).
  last_merged: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
  merged: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # m -> [steps, tokens]
  norms: list[float] = dataclasses.field(default_factory=list)  # recent finite Δ norms (screen)

  @classmethod
  def fresh(cls, values: dict[str, np.ndarray], tx: optax.GradientTransformation):
    """Version 0 of a fragment: its optimizer state initialised, no residual."""
    return cls(values, tx.init(values), {k: np.zeros_like(v) for k, v in values.items()})


def state_dict(sync) -> dict[str, Any]:
  """{'arrays': name -> np.ndarray, 'meta': JSON-able} of a `Synchronizer`."""
  frags = sync.fragments  # owned fragment -> its state, in index order
  arrays: dict[str, np.ndarray] = {
      "versions": np.asarray([f.version for f in frags.values()], np.int64)
  }
  for p, f in frags.items():  # by reference: a merge replaces these arrays, never writes them
    for i, k in enumerate(sync.frag.paths[p]):
      arrays[f"global.{p}.{i}"] = np.asarray(f.values[k], np.float32)
      arrays[f"residual.{p}.{i}"] = np.asarray(f.residual[k], np.float32)
    for i, x in enumerate(jax.tree.leaves(f.opt_state)):
      arrays[f"opt.{p}.{i}"] = np.asarray(x)
  meta = {
      "generation": sync.generation,
      "lineage": [[g, list(v)] for g, v in sorted(sync.lineage.items())],
      "contributed": [sorted(f.contributed.items()) for f in frags.values()],
      "merged": [[[m, *st] for m, st in sorted(f.merged.items())] for f in frags.values()],
      "last_merged": [[[m, *k] for m, k in sorted(f.last_merged.items())] for f in frags.values()],
      "norms": [list(f.norms) for f in frags.values()],
      "rms": list(sync.rms),
      "members": sorted(sync.members),
      "ema": [sync.ema_step.value, sync.ema_quorum.value, sync.ema_sync.value],
  }
  if sync.clock.stateful:  # the merge clock's pace and schedule (none under arrival, scale one)
    meta["clock"] = sync.clock.state()
  if len(frags) < sync.frag.num_fragments:  # a shard (all fragments: no key, as before shards)
    meta["owned"] = list(frags)
  return {"arrays": arrays, "meta": json.loads(json.dumps(meta))}


def load_state_dict(sync, state: Mapping[str, Any]) -> None:
  """Puts `state` into `sync`; ValueError naming the array that does not fit its model."""
  arrays, meta = state["arrays"], state["meta"]
  owned = list(sync.fragments)
  if meta.get("owned", owned) != owned:
    raise ValueError(
        f"synchronizer state of fragments {meta['owned']}, but this shard owns {owned}"
    )
  want = state_dict(sync)["arrays"]
  if sorted(arrays) != sorted(want):
    raise ValueError(
        f"synchronizer state has arrays {sorted(set(arrays) ^ set(want))} "
        "that this model's fragments and outer optimizer do not"
    )
  for name, x in want.items():
    got = np.asarray(arrays[name])
    if got.shape != x.shape or got.dtype != x.dtype:
      raise ValueError(
          f"synchronizer state {name}: {got.dtype}{got.shape}, expected {x.dtype}{x.shape}"
      )
  for i_p, (p, f) in enumerate(list(sync.fragments.items())):
    paths = sync.frag.paths[p]
    treedef = jax.tree.structure(f.opt_state)
    leaves = [np.array(arrays[f"opt.{p}.{i}"]) for i in range(treedef.num_leaves)]
    sync.fragments[p] = FragmentState(
        values={k: np.array(arrays[f"global.{p}.{i}"]) for i, k in enumerate(paths)},
        opt_state=jax.tree.unflatten(treedef, leaves),
        residual={k: np.array(arrays[f"residual.{p}.{i}"]) for i, k in enumerate(paths)},
        version=int(arrays["versions"][i_p]),
        contributed={int(m): int(v) for m, v in meta["contributed"][i_p]},
        merged={int(m): [int(a), int(b)] for m, a, b in _kept(meta, "merged", i_p)},
        last_merged={int(m): tuple(int(x) for x in k) for m, *k in _kept(meta, "last_merged", i_p)},
        norms=[float(x) for x in meta["norms"][i_p]],
    )
  sync.generation = int(meta["generation"])
  sync.lineage = {int(g): [int(x) for x in v] for g, v in meta["lineage"]}
  sync.rms = [float(x) for x in meta["rms"]]
  sync.members = {int(m) for m in meta["members"]}
  sync.ema_step.value, sync.ema_quorum.value, sync.ema_sync.value = meta["ema"]
  sync.clock.load(meta.get("clock"))


def _kept(meta: Mapping[str, Any], key: str, i_p: int) -> list:
  """meta[key] of the i_p-th owned fragment ([] in a checkpoint from before it was kept)."""
  rows = meta.get(key)
  return rows[i_p] if rows is not None else []


def _hash_arrays(state: Mapping[str, Any]) -> Any:
  """sha256 fed with every array's name, dtype, shape and bytes, in name order."""
  h = hashlib.sha256()
  for name in sorted(state["arrays"]):
    x = np.ascontiguousarray(state["arrays"][name])
    h.update(f"{name}:{x.dtype.str}:{x.shape}:".encode())
    h.update(memoryview(x).cast("B"))
  return h


def arrays_digest(state: Mapping[str, Any]) -> str:
  """sha256 over the arrays of a state only (what a checkpoint restores bit for bit)."""
  return _hash_arrays(state).hexdigest()


def digest(state: Mapping[str, Any]) -> str:
  """sha256 over a state: every array's name, dtype, shape and bytes, then the metadata."""
  h = _hash_arrays(state)
  h.update(json.dumps(state["meta"], sort_keys=True).encode())
  return h.hexdigest()


def merged_work(fragments: Mapping[int, FragmentState]) -> dict[int, dict[str, dict[int, int]]]:
  """Learner -> {'steps': fragment -> inner steps, 'tokens': fragment -> tokens} that reached
  a merge: the sums over the uploads each fragment merged (each counts the learner's progress
  since it last received that fragment; a refused one counts nothing)."""
  out: dict[int, dict[str, dict[int, int]]] = {}
  for p, f in fragments.items():
    for m, (steps, tokens) in list(f.merged.items()):  # (a status read races merges)
      work = out.setdefault(m, {"steps": {}, "tokens": {}})
      work["steps"][p], work["tokens"][p] = steps, tokens
  return dict(sorted(out.items()))


def lineage_after(
    lineage: Mapping[int, list[int]], old: int, new: int, restored: list[int]
) -> dict[int, list[int]]:
  """The version history after a restart from a checkpoint holding versions `restored`, as
  generation `new` (> `old`): versions up to the checkpoint's are shared with the checkpoint's
  generation and, as far as they were shared with it, with earlier ones; later ones forgotten."""
  if new <= old:
    raise ValueError(f"new generation {new} must exceed {old}")
  out = {g: [min(a, b) for a, b in zip(v, restored)] for g, v in lineage.items()}
  for g in range(old, new):
    out[g] = list(restored)
  return out
