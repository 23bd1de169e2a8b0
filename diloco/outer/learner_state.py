"""What survives a crash of a learner (`Learner.checkpoint_state`): its train state and, on the
host, its counters, the fragment versions it holds and its copy of them (with at_own_sync's base
and the uplink's residuals), in the held form the learner keeps them (`Learner.save_form`)."""

from collections.abc import Mapping
from typing import Any

import numpy as np

from diloco.outer import fragments


def state(learner) -> dict[str, Any]:
  """What a crash must not lose: {'train': TrainState, 'host': name -> np.ndarray}."""
  host = {
      "versions": learner.versions,
      "generations": learner.generations,
      "c_steps": learner.c_steps,
      "c_tokens": learner.c_tokens,
      "counters": [learner.steps, learner.tokens, *learner.sync_generations],
  }
  own_base = learner.delivery == "at_own_sync"  # (the base is the newest version otherwise)
  if own_base:
    host.update(
        bases=learner.base_versions
        + learner.base_generations
        + learner.adopt_at
        + learner.own_merged
    )
  host = {k: np.asarray(v, np.int64) for k, v in host.items()}
  for p in range(learner.frag.num_fragments):
    for i, k in enumerate(learner.frag.paths[p]):
      host[f"global.{p}.{i}"] = learner.save_form(k, learner.global_copy[p][k])
      if own_base:
        host[f"base.{p}.{i}"] = learner.save_form(k, learner.base_copy[p][k])
    if learner.uplink.error_feedback:
      shapes = {k: learner.global_copy[p][k].shape for k in learner.frag.paths[p]}
      res = learner.uplink.residual_of(p, shapes)
      host.update(
          {
              f"residual.{p}.{i}": learner.save_form(k, res[k])
              for i, k in enumerate(learner.frag.paths[p])
          }
      )
  return {"train": learner.state, "host": host}


def like(learner) -> dict[str, Any]:
  """The shapes of `checkpoint_state()` (a restore target), from this learner's island."""
  n, params = learner.frag.num_fragments, fragments.flatten(learner.island.abstract_state().params)
  host = {k: np.zeros(n, np.int64) for k in ("versions", "generations", "c_steps", "c_tokens")}
  host["counters"] = np.zeros(2 + len(learner.sync_generations), np.int64)
  own_base = learner.delivery == "at_own_sync"
  if own_base:
    host["bases"] = np.zeros(4 * n, np.int64)
  for p in range(n):
    for i, k in enumerate(learner.frag.paths[p]):
      host[f"global.{p}.{i}"] = learner.save_like(k, params[k])
      if own_base:
        host[f"base.{p}.{i}"] = learner.save_like(k, params[k])
      if learner.uplink.error_feedback:
        host[f"residual.{p}.{i}"] = learner.save_like(k, params[k])
  return {"train": learner.island.abstract_state(), "host": host}


def load(learner, saved: Mapping[str, Any]) -> None:
  """Continues from `checkpoint_state()` output (restored onto this learner's island)."""
  host, n = saved["host"], learner.frag.num_fragments
  learner.state = saved["train"]
  learner.versions, learner.generations = (
      [int(x) for x in host[k]] for k in ("versions", "generations")
  )
  learner.c_steps, learner.c_tokens = ([int(x) for x in host[k]] for k in ("c_steps", "c_tokens"))
  learner.steps, learner.tokens, *gens = (int(x) for x in host["counters"])
  learner.sync_generations = gens
  learner.global_copy = [
      {
          k: learner.from_saved(k, host[f"global.{p}.{i}"])
          for i, k in enumerate(learner.frag.paths[p])
      }
      for p in range(n)
  ]
  learner.base_copy = list(learner.global_copy)
  learner.base_versions, learner.base_generations = list(learner.versions), list(
      learner.generations
  )
  learner.adopt_at, learner.own_merged = [-1] * n, [0] * n
  if "bases" in host:
    bases = [int(x) for x in host["bases"]]
    learner.base_versions, learner.base_generations = bases[:n], bases[n : 2 * n]
    learner.adopt_at, learner.own_merged = bases[2 * n : 3 * n], bases[3 * n :]
    learner.base_copy = [
        {k: learner.from_saved(k, host[f"base.{p}.{i}"]) for i, k in enumerate(paths)}
        for p, paths in enumerate(learner.frag.paths)
    ]
  if learner.uplink.error_feedback:
    learner.uplink.residuals = {
        p: {k: learner.from_saved(k, host[f"residual.{p}.{i}"]) for i, k in enumerate(paths)}
        for p, paths in enumerate(learner.frag.paths)
    }
