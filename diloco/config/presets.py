"""Modes as data: the `outer` knobs each mode's preset sets, applied when a config is resolved.

Synchronous DiLoCo and Streaming DiLoCo are the synchronizer with quorum = all learners, no grace,
equal weights and a plain mean, with blocking learners; Decoupled DiLoCo changes only those knobs.
A preset fills only keys that were not given explicitly (diloco/config/resolve.py); `RUNLOCAL`
holds what `runlocal` changes per mode on top. diloco/train.py maps each mode to its runner.

Decoupled DiLoCo (paper defaults, reconstructed): P=24 balanced fragments, each synced every H=24
steps, tau=2, quorum K=1, adaptive grace, token weights, RDA, fp4; learners never wait and keep
the progress a merge they were not part of lacks (`outer.delivery=rebase`, outer lr 0.1). Merges are
damped by staleness: learners in phase whose uploads of one base merge one by one (K=1, a grace
window shorter than their spread) would otherwise add their outer gradients up. Outer gradients
above 4x the recent median norm are clipped to it: after an outage of the synchronizer, learners
that trained on upload the progress of many steps at once, and the outer momentum would carry it
several times over (a loss spike from 2.5 to 17 in chaos_local).

mode=compare runs dp, diloco and decoupled on one token budget, the last learner 3x slower
(`sim.speeds` is derived in resolve.py), each with its own preset (`compare_runs`).

A recipe (`recipe=`, `RECIPES`) is a paper's inner optimizer and model, filled after the mode's
preset in the same way, over any mode. charles2025 is the protocol of the DiLoCo scaling laws
(Charles et al. 2025, arXiv 2503.09799): AdamW beta2 0.99, warmup then cosine to 5% of the peak,
independent weight decay lambda = 1/T over the run's T steps (resolve.py derives T from `steps`),
QK-norm and an output z-loss. The paper's z-loss coefficient is not confirmed here: 1e-4 is the
one of Wortsman et al. 2023 (arXiv 2309.14322) and PaLM, the recipe the paper follows.
"""

from typing import Any

MULTI = ("diloco", "streaming", "decoupled", "compare")  # modes with several learners
SYNCHRONOUS = {
    "outer.fragments": 1,
    "outer.overlap": 0,
    "outer.codec": "fp32",
    "outer.blocking": True,
    "outer.quorum": 0,
    "outer.grace_gamma": 0.0,
    "outer.weighting": "equal",
    "outer.merge": "mean",
}
DECOUPLED = {
    "outer.fragments": 24,
    "outer.fragment_kind": "balanced",
    "outer.inner_steps": 24,
    "outer.overlap": 2,
    "outer.codec": "fp4",
    "outer.quorum": 1,
    "outer.grace_gamma": 0.8,
    "outer.weighting": "tokens",
    "outer.merge": "rda",
    "outer.blocking": False,
    "outer.staleness_damping": True,
    "outer.clip_factor": 4.0,
    # issue 51's table at the paper's setting: rebase keeps each learner's work and beats replace
    # at K=1 (with and without grace), text and vision; it wants a smaller outer rate (its best
    # in the README main job: 0.1, where replace's is 0.4)
    "outer.delivery": "rebase",
    "outer.lr": 0.1,
}
MODES: dict[str, dict[str, Any]] = {
    "dp": {},  # one island, data-parallel SPMD over every local device; `outer` is unused
    "diloco": SYNCHRONOUS,  # all learners, every H steps, plain mean, Nesterov outer step
    "streaming": {**SYNCHRONOUS, "outer.fragments": 4, "outer.overlap": 1, "outer.codec": "fp4"},
    "decoupled": {**SYNCHRONOUS, **DECOUPLED},
    # the README's main job: H=20 over 2,000 steps, 100 outer steps (configs/shakespeare.py)
    "compare": {"outer.inner_steps": 20},
}
# What `runlocal` changes per mode, over the preset: two learners, shorter rounds, fewer fragments.
RUNLOCAL: dict[str, dict[str, Any]] = {
    "dp": {},
    "diloco": {"outer.learners": 2, "outer.inner_steps": 10},
    "streaming": {"outer.learners": 2, "outer.inner_steps": 10, "outer.fragments": 2},
    "decoupled": {"outer.learners": 2, "outer.inner_steps": 8, "outer.fragments": 4},
    "compare": {
        "outer.learners": 2,
        "compare.decoupled_fragments": 4,
        "compare.decoupled_inner_steps": 8,
    },
}
RECIPES: dict[str, dict[str, Any]] = {
    "none": {},
    "charles2025": {
        "optimizer.b2": 0.99,
        "optimizer.min_lr_ratio": 0.05,
        "optimizer.weight_decay_kind": "independent",  # T = steps: resolve.DERIVED
        "model.qk_norm": True,
        "model.z_loss": 1e-4,
    },
}
# The outer keys a mode preset sets: in mode=compare each compared run takes them from its own
# mode's preset, so giving one explicitly is refused (diloco/config/checks.py).
POLICY_KEYS = tuple(
    sorted({k for preset in MODES.values() for k in preset} - {"outer.inner_steps"})
)


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
