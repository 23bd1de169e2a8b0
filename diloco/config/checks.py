"""Every check of a resolved config, before anything runs: one error naming every bad key.

`check(config)` returns the config or raises `ConfigError` listing each problem as
`key=value: why`. It checks value domains, keys that only matter with another key set, options a
mode does not support, and what the model's shapes imply (seq_len against max_len, fragments
against the parameter tensors, from `jax.eval_shape`: nothing is allocated or trained). Every
entry point calls it: experiments.train (through train_and_evaluate), each sweep point before any
runs, the learner and synchronizer processes and the launchers.
"""

import ml_collections
from ml_collections import config_dict

from diloco import errors
from diloco.config import bounds, dependent, deploy as deploy_lib, keys, outer_check, presets
from diloco.config import resolve, shape_check
from diloco.config.dependent import get as _get

Problems = list[tuple[str, str]]  # (key, why)


class ConfigError(errors.InputError):
  """A config that cannot run as written; the message lists every bad key."""

  def __init__(self, problems: Problems, config: ml_collections.ConfigDict | None = None):
    self.problems = problems
    lines = [
        f"  {why}" if why.startswith(key) else f"  {key}{_value(config, key)}: {why}"
        for key, why in problems
    ]
    n = len(problems)
    super().__init__(f"{n} problem{'s' if n > 1 else ''} in the config:\n" + "\n".join(lines))


def _value(config, key: str) -> str:
  try:
    value = _get(config, key)
  except (KeyError, AttributeError, TypeError):
    return ""
  return f"={value!r}"


def check(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` (resolved) if it can run; otherwise ConfigError naming every bad key."""
  problems = problems_of(config)
  if problems:
    raise ConfigError(problems, config)
  return config


def prepare(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config a run runs: every preset and derived key resolved (diloco/config/resolve.py),
  then every check. Nothing is written."""
  return check(resolve.resolve(config))


def problems_of(c: ml_collections.ConfigDict) -> Problems:
  """Every problem of `c`, and of each run of mode=compare (prefixed with the run's mode)."""
  out: Problems = []
  if c.get("mode") not in presets.MODES:
    return [("mode", f"unknown mode; expected one of {sorted(presets.MODES)}")]
  for rule in RULES:
    out += rule(c)
  if c.mode == "compare":
    out += _compare(c)
  else:
    out += shape_check.problems(c)
  return out


def _domains(c) -> Problems:
  """Every key against the domain declared with it (numbers in range, names the code knows)."""
  out = []
  for path, field in keys.leaves(c):
    domain = keys.DOMAINS.get(path)
    value = field.get() if isinstance(field, config_dict.FieldReference) else field
    why = domain and domain.problem(value, c)
    if why:
      out.append((path, why))
  return out


def _model_size(c) -> Problems:
  from diloco.config import variants

  if "size" in c.model and not variants.size_fields(c.model.size):
    known = sorted([*variants.MODEL_SIZES, *variants.VIT_SIZES])
    return [("model.size", f"unknown model size; known: {known}")]
  return []


def _outer(c) -> Problems:
  """The outer section's rules across keys (outer_check: delivery, anchor, restart window, DyLU)
  and the learner lists."""
  from diloco.config import build

  out = []
  try:
    outer_check.check(c.outer)
  except ValueError as e:
    out.append((str(e).split("=", 1)[0].split(" ", 1)[0], str(e)))
  if c.mode not in ("dp",) and isinstance(c.outer.learners, int) and c.outer.learners >= 1:
    m = c.outer.learners
    lists = (("speeds", float), ("batch_sizes", int), ("start_times", float), ("stop_times", float))
    parsed = {}
    for key, kind in lists:
      try:
        default = 0.0 if key.endswith("_times") else 1
        parsed[key] = values = build.parse_list(c.sim.get(key, ""), m, kind, default, f"sim.{key}")
      except ValueError as e:
        out.append((f"sim.{key}", str(e)))
        continue
      if key in ("speeds", "batch_sizes") and any(v <= 0 for v in values):
        out.append((f"sim.{key}", "every entry must be positive"))
      if key == "stop_times" and any(v < 0 for v in values):
        out.append((f"sim.{key}", "every entry must be >= 0 (0: never)"))
      elif key == "stop_times" and "start_times" in parsed:
        pairs = enumerate(zip(parsed["start_times"], values))
        early = [i for i, (a, b) in pairs if 0 < b <= a]
        if early:
          out.append((f"sim.{key}", f"learners {early} would stop before they start"))
  return out


def _chaos(c) -> Problems:
  from diloco.chaos import schedule

  if c.chaos.schedule in ("", "none"):
    return []
  if c.mode == "dp":
    return [("chaos.schedule", "faults need learners and a synchronizer: mode=dp has neither")]
  if c.stop_after_steps:
    return [
        (
            "stop_after_steps",
            "a run with faults cannot be stopped and resumed (its faults' "
            "state is not snapshotted): run it whole",
        )
    ]
  try:
    faults = schedule.from_config(c.chaos, c.outer.learners, c.steps * c.sim.step_s)
  except (ValueError, OSError) as e:
    return [("chaos.schedule", str(e))]
  if any(f.kind == "sync_crash" for f in faults) and not c.outer.sync_checkpoint_every:
    return [("outer.sync_checkpoint_every", "sync_crash faults need synchronizer checkpoints")]
  shards = c.outer.sync_shards
  for f in faults:
    if f.shard is not None and (shards < 2 or f.shard >= shards):
      return [
          (
              "chaos.schedule",
              f"{f.describe()!r}: outer.sync_shards={shards} has no shard {f.shard} to crash "
              "alone (shards 0..S-1 of S >= 2)",
          )
      ]
  return []


def _deploy(c) -> Problems:
  if "deploy" not in c:
    return []
  try:
    deploy_lib.check(c.deploy)
  except ValueError as e:
    return [("deploy", str(e))]
  return []


def _compare(c) -> Problems:
  """mode=compare: each compared mode runs at its own preset, so policy keys given explicitly
  would be overwritten; and every compared run is checked as it will run."""
  out = []
  modes = c.compare.modes.split(",")
  bad = [m for m in modes if m not in presets.MODES or m == "compare"]
  if bad or not modes:
    return [
        ("compare.modes", f"unknown modes {bad}; expected some of dp,diloco,streaming,decoupled")
    ]
  policy = presets.policy_keys(c)
  for path, field in keys.leaves(c):
    if path in policy and resolve.source(field) == "explicit":
      out.append((path, "mode=compare runs each mode at its own preset; run the mode alone"))
  try:
    unknown = sorted(set(presets.inner_lrs(c.compare.inner_lrs)) - set(modes))
  except ValueError as e:
    return out + [("compare.inner_lrs", str(e))]
  if unknown:
    out.append(("compare.inner_lrs", f"names modes that are not compared: {unknown}"))
  for mode, sub in resolve.compare_runs(c).items():
    out += [(k, f"in the compared {mode} run: {why}") for k, why in problems_of_run(sub)]
  return out


def problems_of_run(c: ml_collections.ConfigDict) -> Problems:
  """The problems of one run's config (no compare recursion)."""
  out = []
  for rule in RULES:
    out += rule(c)
  return out + shape_check.problems(c)


def _trackers(c) -> Problems:
  from diloco.watch import trackers

  return [("trackers", why) for why in trackers.problems(c.get("trackers", ""))]


RULES = (
    _domains,
    _model_size,
    dependent.problems,
    _outer,
    _chaos,
    _deploy,
    _trackers,
    bounds.problems,
)
