"""One resolved config: every key a preset or a derivation fills, filled the same way every time.

`resolve(c)` fills each `keys.Auto` key that was not given explicitly, from the first of the
layers its declaration holds that has a value for it:

  1. `runlocal`: the key's runlocal value, then its value under runlocal for the mode (`local`);
  2. the mode: the key's value for the mode;
  3. the recipe: the key's value for the recipe (`recipes`);
  4. a derivation from other keys (`derive`, one of the functions below: the schedule's decay
     steps, the independent weight decay's time constant, the chaos checkpoints and staleness
     bound, the compare run's speeds, the FSDP axis from the model's size; and a model's shape
     and numerics from `model.size`);
  5. the key's default.

An explicit value (a variant after the colon, a `--config.` flag, a sweep point, code) always
wins, so `:mode=decoupled` and `--config.mode=decoupled` give the same config, and `--config.steps`
moves the decay steps as `:steps` does. Resolving twice gives the same config. The functions here
import nothing heavy: config files call them.
"""

from typing import Any

import ml_collections

from diloco.config import keys, presets, variants


def decay_steps(c) -> int:
  """The cosine decays to the end of the run."""
  return max(c.steps - c.optimizer.warmup_steps, 1)


def _chaos(c) -> bool:
  return c.chaos.schedule != "none"


def speeds(c) -> str:
  """mode=compare: the last learner 3x slower."""
  if c.mode != "compare":
    return ""
  return ",".join(["1"] * (c.outer.learners - 1) + ["3"])


def weight_decay_time_constant(c) -> int:
  """Independent weight decay: lambda = 1/T with T the run's length (Charles et al. 2025)."""
  return c.steps if c.optimizer.weight_decay_kind == "independent" else 0


# A fault schedule turns on checkpoints on both sides and a staleness bound for late learners.
def learner_checkpoint_every(c) -> int:
  return c.outer.inner_steps if _chaos(c) else 0


def sync_checkpoint_every(c) -> int:
  return c.outer.fragments if _chaos(c) else 0


def max_staleness(c) -> int:
  return 4 * c.outer.learners if _chaos(c) else 1 << 20


def fsdp(c) -> int:
  """From 35m parameters up, parameters and optimizer state are sharded over the whole island."""
  return -1 if c.model.get("size") in variants.LARGE_SIZES else 1


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
    value = _layered(ref, runlocal, mode, recipe)
    if value is keys.unset():
      later.append((path, ref))
    else:
      ref.fill(value)
  for path, ref in later:
    ref.fill(_derived(c, path, ref))
  return c


def _layered(ref: keys.Auto, runlocal: bool, mode: str, recipe: str) -> Any:
  """The value of the first layer that sets the key, or unset (derivation or default next)."""
  unset = keys.unset()
  if runlocal and ref.runlocal is not unset:
    return ref.runlocal
  if runlocal and mode in ref.local:
    return ref.local[mode]
  if mode in ref.modes:
    return ref.modes[mode]
  return ref.recipes.get(recipe, unset)


def _derived(c: ml_collections.ConfigDict, path: str, ref: keys.Auto) -> Any:
  if ref.derive is not None:
    return ref.derive(c)
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
      sub.update_from_flattened_dict(presets.mode_preset(c, mode))
      sub.update_from_flattened_dict(presets.compare_overrides(base, mode))
    sub.lock()
    out[mode] = sub
  return out
