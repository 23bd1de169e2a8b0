"""Modes and recipes: their names, and what a mode's preset is, read from the keys' declarations.

Each key declares its own values (`keys.Auto`, in the config file's declaration of the key): per
mode, per mode under `runlocal` (`local`) and per recipe (`recipes`); this module lists the modes
and recipes and reads a mode's preset back from them. A preset fills only keys that were not
given explicitly (diloco/config/resolve.py). diloco/train.py maps each mode to its runner.

Synchronous DiLoCo and Streaming DiLoCo are the synchronizer with quorum = all learners, no grace,
equal weights and a plain mean, with blocking learners; Decoupled DiLoCo changes only those knobs.

Decoupled DiLoCo (paper defaults, reconstructed): P=24 balanced fragments, each synced every H=24
steps, tau=2, quorum K=1, adaptive grace, token weights, RDA, fp4; learners never wait and keep
the progress a merge they were not part of lacks (`outer.delivery=rebase`); each fragment merges once
per H steps of the fastest live learner's pace (`outer.merge_clock=period`, outer lr 0.2: issue
69's evidence, BENCHMARKS.md "The merge clock"). Merges are damped by staleness: learners in phase whose uploads of one base merge one by one (K=1, a grace
window shorter than their spread) would otherwise add their outer gradients up. Outer gradients
above 4x the recent median norm are clipped to it: after an outage of the synchronizer, learners
that trained on upload the progress of many steps at once, and the outer momentum would carry it
several times over (a loss spike from 2.5 to 17 in chaos_local).

mode=compare runs dp, diloco and decoupled on one token budget, the last learner 3x slower
(`sim.speeds` is derived in resolve.py), each with its own preset (`compare_runs`).

A recipe (`recipe=`, `RECIPES`; its values declared on the keys it sets) is a paper's inner
optimizer and model, filled after the mode's preset in the same way, over any mode. charles2025
is the protocol of the DiLoCo scaling laws (Charles et al. 2025, arXiv 2503.09799): AdamW beta2
0.99, warmup then cosine to 5% of the peak, independent weight decay lambda = 1/T over the run's
T steps (resolve.py derives T from `steps`),
QK-norm and an output z-loss. The paper's z-loss coefficient is not confirmed here: 1e-4 is the
one of Wortsman et al. 2023 (arXiv 2309.14322) and PaLM, the recipe the paper follows.
"""

from typing import Any

import ml_collections

from diloco.config import keys

MODES = ("dp", "diloco", "streaming", "decoupled", "compare")
MULTI = ("diloco", "streaming", "decoupled", "compare")  # modes with several learners
RECIPES = ("none", "charles2025")
# Keys every run of mode=compare takes from the comparison, whatever its mode's preset says.
COMPARE_KEEPS = ("outer.inner_steps",)


def mode_preset(c: ml_collections.ConfigDict, mode: str) -> dict[str, Any]:
  """What `mode`'s preset sets, by dotted key: each key's declared value for the mode."""
  autos = [(p, f) for p, f in keys.leaves(c) if isinstance(f, keys.Auto)]
  if not autos:
    raise ValueError("a mode's preset is read from the config as declared (its keys.Auto keys)")
  return {p: f.modes[mode] for p, f in autos if mode in f.modes}


def policy_keys(c: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The keys a compared mode's preset sets: in mode=compare each compared run takes them from
  its own mode's preset, so giving one explicitly is refused (diloco/config/checks.py)."""
  modes = [m for m in MODES if m != "compare"]
  return tuple(sorted({k for m in modes for k in mode_preset(c, m)} - set(COMPARE_KEEPS)))


def compare_overrides(config, mode: str) -> dict[str, Any]:
  """What a run of mode=compare changes after its mode's preset (flattened keys).

  Every run keeps the comparison's learners, H, budget, model and data; data-parallel trains one
  island over all devices with M x the batch (same steps and tokens); Decoupled DiLoCo uses its
  own fragments and H from the `compare` section.
  """
  o, cmp = config.outer, config.compare
  per_mode = {
      "dp": {"batch_size": config.batch_size * o.learners},
      "decoupled": {
          "outer.fragments": cmp.decoupled_fragments,
          "outer.inner_steps": cmp.decoupled_inner_steps,
      },
  }
  lrs = inner_lrs(cmp.inner_lrs)
  per_mode.setdefault(mode, {}).update({"optimizer.lr": lrs[mode]} if mode in lrs else {})
  return {"outer.inner_steps": o.inner_steps, **per_mode.get(mode, {})}


def inner_lrs(text: str) -> dict[str, float]:
  """`compare.inner_lrs` ('dp=1e-2,diloco=2e-2') as {mode: lr}; ValueError naming a bad entry."""
  out = {}
  for item in filter(None, (s.strip() for s in text.split(","))):
    mode, _, value = item.partition("=")
    try:
      out[mode.strip()] = float(value)
    except ValueError:
      raise ValueError(f"compare.inner_lrs entry {item!r}: expected mode=learning_rate") from None
    if not out[mode.strip()] > 0:
      raise ValueError(f"compare.inner_lrs entry {item!r}: the learning rate must be > 0")
  return out
