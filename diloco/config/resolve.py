"""One resolved config: every key a preset or a derivation fills, filled the same way every time.

`resolve(c)` fills each `keys.Auto` key that was not given explicitly, from the first layer that
has a value for it:

  1. `runlocal`: the key's own runlocal value, then `presets.RUNLOCAL[mode]`;
  2. the mode: the key's own value for the mode, then `presets.MODES[mode]`;
  3. the recipe: `presets.RECIPES[recipe]`;
  4. a derivation from other keys (`DERIVED`: the schedule's decay steps, the independent weight
     decay's time constant, the chaos checkpoints and staleness bound, the compare run's speeds,
     a model's shape and numerics from `model.size`, the FSDP axis from its size);
  5. the key's default.

An explicit value (a variant after the colon, a `--config.` flag, a sweep point, code) always
wins, so `:mode=decoupled` and `--config.mode=decoupled` give the same config, and `--config.steps`
moves the decay steps as `:steps` does. Resolving twice gives the same config. The functions here
import nothing heavy: config files call them.
"""

from collections.abc import Callable
from typing import Any

import ml_collections

from diloco.config import keys, presets, variants


def _decay_steps(c) -> int:
  return max(c.steps - c.optimizer.warmup_steps, 1)


def _chaos(c) -> bool:
  return c.chaos.schedule != "none"


def _speeds(c) -> str:
  """mode=compare: the last learner 3x slower."""
  if c.mode != "compare":
    return ""
  return ",".join(["1"] * (c.outer.learners - 1) + ["3"])


def _weight_decay_time_constant(c) -> int:
  """Independent weight decay: lambda = 1/T with T the run's length (Charles et al. 2025)."""
  return c.steps if c.optimizer.weight_decay_kind == "independent" else 0


DERIVED: dict[str, Callable[[Any], Any]] = {
    "optimizer.decay_steps": _decay_steps,  # cosine decay to the end of the run
    "optimizer.weight_decay_time_constant": _weight_decay_time_constant,
    # a fault schedule turns on checkpoints on both sides and a staleness bound for late learners
    "outer.learner_checkpoint_every": lambda c: c.outer.inner_steps if _chaos(c) else 0,
    "outer.sync_checkpoint_every": lambda c: c.outer.fragments if _chaos(c) else 0,
    "outer.max_staleness": lambda c: 4 * c.outer.learners if _chaos(c) else 1 << 20,
    "sim.speeds": _speeds,
    # from 35m parameters up, parameters and optimizer state are sharded over the whole island
    "mesh.fsdp": lambda c: -1 if c.model.get("size") in variants.LARGE_SIZES else 1,
}


def resolve(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills every Auto key of `c` that was not given explicitly (in place); returns `c`."""
  mode, runlocal = c.get("mode", ""), bool(c.get("runlocal", False))
  if mode and mode not in presets.MODES:
    raise ValueError(f"mode={mode!r}: unknown mode; expected one of {sorted(presets.MODES)}")
  recipe = c.get("recipe", "none")
  if recipe not in presets.RECIPES:
    raise ValueError(f"recipe={recipe!r}: unknown recipe; expected one of {list(presets.RECIPES)}")
  autos = [(p, f) for p, f in keys.leaves(c) if isinstance(f, keys.Auto) and not f.explicit]
  later = []
  for path, ref in autos:
    value = _layered(ref, path, runlocal, mode, recipe)
    if value is keys.unset():
      later.append((path, ref))
    else:
      ref.fill(value)
  for path, ref in later:
    ref.fill(_derived(c, path, ref))
  return c


def _layered(ref: keys.Auto, path: str, runlocal: bool, mode: str, recipe: str) -> Any:
  """The value of the first layer that sets `path`, or unset (derivation or default next)."""
  unset = keys.unset()
  if runlocal and ref.runlocal is not unset:
    return ref.runlocal
  if runlocal and path in presets.RUNLOCAL.get(mode, {}):
    return presets.RUNLOCAL[mode][path]
  if mode in ref.modes:
    return ref.modes[mode]
  if path in presets.MODES.get(mode, {}):
    return presets.MODES[mode][path]
  return presets.RECIPES[recipe].get(path, unset)


def _derived(c: ml_collections.ConfigDict, path: str, ref: keys.Auto) -> Any:
  if path in DERIVED:
    return DERIVED[path](c)
  section, _, name = path.rpartition(".")
  if section == "model" and name != "size" and "size" in c.model:
    return variants.size_fields(c.model.size).get(name, ref.default)
  return ref.default


def source(field: Any) -> str:
  """'explicit' or 'preset' for an Auto key, '' for a key that only the file or a user sets."""
  if not isinstance(field, keys.Auto):
    return ""
  return "explicit" if field.explicit else "preset"


def compare_runs(c: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """mode=compare's runs: each mode's preset over the comparison's resolved config, then
  `presets.compare_overrides` (the same learners, H and budget); plain, resolved configs."""
  base = c.copy_and_resolve_references()
  out = {}
  for mode in base.compare.modes.split(","):
    sub = base.copy_and_resolve_references()
    with sub.unlocked():
      sub.mode = mode
      sub.update_from_flattened_dict(dict(presets.MODES.get(mode, {})))
      sub.update_from_flattened_dict(presets.compare_overrides(base, mode))
    sub.lock()
    out[mode] = sub
  return out
