"""The synchronizer's durable state as flat arrays plus JSON metadata, and its digest.

`state_dict(sync)` is what a checkpoint saves and a restart loads: per fragment the global values,
the downlink residuals and the outer optimizer state's leaves (named `global.p.i`, `residual.p.i`,
`opt.p.i`, i in the fragment's sorted path order or the optimizer's leaf order), the versions, and
as metadata the generation and its lineage, who contributed on which base, the outlier screen's
norm history, the members and the EMAs behind the grace window.
"""

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


def state_dict(sync) -> dict[str, Any]:
  """{'arrays': name -> np.ndarray, 'meta': JSON-able} of a `Synchronizer`."""
  arrays: dict[str, np.ndarray] = {"versions": np.asarray(sync.versions, np.int64)}
  for p in range(sync.frag.num_fragments):
    for i, k in enumerate(sync.frag.paths[p]):
      arrays[f"global.{p}.{i}"] = np.array(sync.globals[p][k], np.float32)
      arrays[f"residual.{p}.{i}"] = np.array(sync.residuals[p][k], np.float32)
    for i, x in enumerate(jax.tree.leaves(sync.opt_states[p])):
      arrays[f"opt.{p}.{i}"] = np.array(x)
  meta = {
      "generation": sync.generation,
      "lineage": [[g, list(v)] for g, v in sorted(sync.lineage.items())],
      "contributed": [sorted(c.items()) for c in sync.contributed],
      "norms": [list(n) for n in sync.norms],
      "rms": list(sync.rms),
      "members": sorted(sync.members),
      "ema": [sync.ema_step.value, sync.ema_quorum.value, sync.ema_sync.value],
  }
  return {"arrays": arrays, "meta": json.loads(json.dumps(meta))}


def load_state_dict(sync, state: Mapping[str, Any]) -> None:
  """Puts `state` into `sync`; ValueError naming the array that does not fit its model."""
  arrays, meta = state["arrays"], state["meta"]
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
  sync.versions = [int(v) for v in arrays["versions"]]
  for p in range(sync.frag.num_fragments):
    paths = sync.frag.paths[p]
    sync.globals[p] = {k: np.array(arrays[f"global.{p}.{i}"]) for i, k in enumerate(paths)}
    sync.residuals[p] = {k: np.array(arrays[f"residual.{p}.{i}"]) for i, k in enumerate(paths)}
    treedef = jax.tree.structure(sync.opt_states[p])
    leaves = [np.array(arrays[f"opt.{p}.{i}"]) for i in range(treedef.num_leaves)]
    sync.opt_states[p] = jax.tree.unflatten(treedef, leaves)
  sync.generation = int(meta["generation"])
  sync.lineage = {int(g): [int(x) for x in v] for g, v in meta["lineage"]}
  sync.contributed = [{int(m): int(v) for m, v in c} for c in meta["contributed"]]
  sync.norms = [[float(x) for x in n] for n in meta["norms"]]
  sync.rms = [float(x) for x in meta["rms"]]
  sync.members = {int(m) for m in meta["members"]}
  sync.ema_step.value, sync.ema_quorum.value, sync.ema_sync.value = meta["ema"]


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
