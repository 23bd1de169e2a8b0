"""Every check of a resolved config, before anything runs: one error naming every bad key.

`check(config)` returns the config or raises `ConfigError` listing each problem as
`key=value: why`. It checks value domains, keys that only matter with another key set, options a
mode does not support, and what the model's shapes imply (seq_len against max_len, fragments
against the parameter tensors, from `jax.eval_shape`: nothing is allocated or trained). Every
entry point calls it: experiments.train (through train_and_evaluate), each sweep point before any
runs, the learner and synchronizer processes and the launchers.
"""

from typing import Any

import ml_collections
from ml_collections import config_dict

from diloco import errors
from diloco.config import bounds, deploy as deploy_lib, keys, presets
from diloco.config import resolve, shape_check
from diloco.outer.learner import learner as learner_lib

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
  """The outer section's rules across keys (`outer_rules`: delivery, anchor, restart window,
  DyLU) and the learner lists."""
  from diloco.config import build

  out = []
  try:
    outer_rules(c.outer)
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


def _harness(c) -> Problems:
  """eval.harness_tasks: the harness installed and every task found (local YAML loaded)."""
  spec = c.get("eval", {}).get("harness_tasks", "")
  if not spec:
    return []
  import importlib.util

  if importlib.util.find_spec("lm_eval") is None:
    return [("eval.harness_tasks", "needs lm-evaluation-harness: pip install -e '.[eval]'")]
  from diloco.harness import tasks

  try:
    tasks.resolve(spec, check=True)
  except tasks.TaskError as e:
    return [("eval.harness_tasks", str(e).removeprefix("--tasks: "))]
  return []


def _trackers(c) -> Problems:
  from diloco.watch import trackers

  return [("trackers", why) for why in trackers.problems(c.get("trackers", ""))]


# ---- the outer section across its keys (each key's own domain is declared with it:
# diloco/config/domains.py) ----


def outer_rules(outer: ml_collections.ConfigDict) -> None:
  """ValueError naming the first bad combination of `outer` keys (delivery, anchor, the restart
  window, restarts of the inner optimizer, DyLU)."""
  broadcast = outer.get("broadcast", "all")
  delivery = outer.get("delivery", "replace")
  if delivery == "rebase" and outer.alpha > 0:
    raise ValueError(
        f"outer.delivery=rebase with outer.alpha={outer.alpha}: rebase keeps all of the "
        "learner's progress the merge lacks, so there is nothing left to mix; alpha is for "
        "replace and at_own_sync"
    )
  anchor = outer.get("anchor", "base")
  if anchor == "global":
    if delivery == "rebase":
      raise ValueError(
          "outer.anchor=global with outer.delivery=rebase: " + learner_lib.GLOBAL_REBASE
      )
    if outer.codec not in learner_lib.GLOBAL_CODECS or outer.get("error_feedback", False):
      raise ValueError(
          f"outer.anchor=global with outer.codec={outer.codec!r}"
          f"{' and error feedback' if outer.get('error_feedback', False) else ''}: under the "
          "global anchor the learners send their fragment's values, which a low-bit codec "
          f"would ruin; use outer.codec in {learner_lib.GLOBAL_CODECS} without error feedback"
      )
  window = outer.get("restart_window_s", 0.0)
  if window > 0 and (broadcast != "contributors" or not outer.blocking):
    raise ValueError(
        f"outer.restart_window_s={window} holds back a merge's contributors, so it needs "
        f"outer.broadcast='contributors' and blocking learners (got {broadcast!r}, "
        f"blocking={outer.blocking})"
    )
  if outer.get("merge_scale", "one") == "tokens" and outer.optimizer == "delayed_nesterov":
    raise ValueError(
        "outer.merge_scale=tokens with outer.optimizer=delayed_nesterov: a merge's share of an "
        "outer step is a fractional Nesterov or SGD step; delayed Nesterov already spreads its "
        "momentum over outer.delayed_period merges (use merge_scale=one)"
    )
  if outer.get("merge_clock", "arrival") == "period" and outer.blocking:
    raise ValueError(
        "outer.merge_clock=period with blocking learners: a blocking learner waits for the merge "
        "of its upload, which the period clock holds until the fragment's scheduled time; the "
        "period clock is for Decoupled learners (outer.blocking=False)"
    )
  schedule_by = outer.get("schedule_by", "own")
  restarts = outer.get("fresh_inner_optimizer", False) or schedule_by == "global"
  if restarts and outer.fragments != 1:
    raise ValueError(
        f"outer.fresh_inner_optimizer / outer.schedule_by=global restart the inner optimizer "
        f"when the whole model comes back: they need outer.fragments=1, got {outer.fragments}"
    )
  if outer.get("dylu", False):
    if outer.inner_steps < 1:
      raise ValueError(f"outer.dylu needs outer.inner_steps >= 1, got {outer.inner_steps}")
    if outer.quorum == 0 and outer.blocking:
      raise ValueError(
          "outer.dylu with outer.quorum=0 and blocking learners: every merge waits for every "
          "learner, so the fast ones would idle through the slow ones' shorter rounds; DyLU is "
          "for asynchronous runs (outer.quorum >= 1)"
      )


# ---- keys that only mean something with another key set (a source's glob, an optimizer's
# constants), sources without the files they need, and validation files that are training files ----


def _has(c, key: str) -> bool:
  """Whether the config has the dotted key."""
  try:
    _get(c, key)
  except (KeyError, AttributeError):
    return False
  return True


def _get(c, path: str) -> Any:
  """The value of the dotted key `path` (KeyError or AttributeError where it is missing)."""
  for part in path.split("."):
    c = c[part]
  return c


# Keys that change nothing unless another key has a value: (key, its default, needs, the value).
DEPENDENT = (
    ("data.text_glob", "", "data.source", "text_glob"),
    ("data.val_text_glob", "", "data.source", "text_glob"),
    ("data.array_record_glob", "", "data.source", "array_record"),
    ("data.val_array_record_glob", "", "data.source", "array_record"),
    ("data.npz_glob", "", "data.source", "npz_glob"),
    ("data.val_npz_glob", "", "data.source", "npz_glob"),
    ("data.corpus", "", "data.source", "corpus"),
    ("data.val_corpus", "", "data.source", "corpus"),
    ("data.corpus_weights", "", "data.source", "corpus"),
    ("data.sp_vocab_size", 1024, "data.tokenizer", "sentencepiece"),
    ("outer.delayed_period", 4, "outer.optimizer", "delayed_nesterov"),
    ("outer.delayed_c", 0.0, "outer.optimizer", "delayed_nesterov"),
    ("optimizer.weight_decay_time_constant", 0, "optimizer.weight_decay_kind", "independent"),
)
# Sources that need their glob.
NEEDS = (
    ("data.source", "text_glob", "data.text_glob"),
    ("data.source", "array_record", "data.array_record_glob"),
    ("data.source", "npz_glob", "data.npz_glob"),
    ("data.source", "corpus", "data.corpus"),
    ("data.source", "corpus", "data.val_corpus"),
)


def _dependent_problems(c) -> Problems:
  """Keys set without the key they depend on, sources without their files, a validation glob
  that matches training files."""
  return _dependent(c) + _val_overlap(c)


def _dependent(c) -> Problems:
  out = _recipe_keys(c)
  for key, default, needs, value in DEPENDENT:
    if _has(c, key) and _get(c, key) != default and _get(c, needs) != value:
      out.append((key, f"only used with {needs}={value!r} (it is {_get(c, needs)!r}): set both"))
  for key, value, needs in NEEDS:
    if _get(c, key) == value and not _get(c, needs):
      out.append((needs, f"{key}={value!r} needs it (the files to train on)"))
  return out


def _recipe_keys(c) -> Problems:
  """An independent decay needs its time constant; the ViT's objective has no output z-loss."""
  out = []
  o = c.optimizer
  if o.get("weight_decay_kind") == "independent" and not o.weight_decay_time_constant >= 1:
    out.append(
        (
            "optimizer.weight_decay_time_constant",
            "weight_decay_kind='independent' needs T >= 1 steps (lambda = 1/T)",
        )
    )
  if c.model.get("z_loss", 0.0) > 0 and c.data.source in ("digits", "npz_glob"):
    out.append(("model.z_loss", "the ViT's objective (image data) has no output z-loss: set 0"))
  return out


# Each source's training glob and the validation glob that must match none of its files.
VAL_GLOBS = (
    ("text_glob", "data.text_glob", "data.val_text_glob"),
    ("array_record", "data.array_record_glob", "data.val_array_record_glob"),
    ("npz_glob", "data.npz_glob", "data.val_npz_glob"),
)


def _val_overlap(c) -> Problems:
  """A validation glob that matches a training file: validation would score training data."""
  from diloco.data import sources

  out = []
  for source, train_key, val_key in VAL_GLOBS:
    if c.data.source != source or not _has(c, val_key) or not _get(c, val_key):
      continue
    train, val = _get(c, train_key), _get(c, val_key)
    if val == train:
      out.append((val_key, f"is {train_key}: validation would score training data"))
    elif train and (shared := sources.shared_file(train, val)):
      why = f"matches {shared}, a {train_key} file: validation would score training data"
      out.append((val_key, f"{why}; make the two globs match disjoint files"))
  return out


RULES = (
    _domains,
    _model_size,
    _dependent_problems,
    _outer,
    _chaos,
    _deploy,
    _trackers,
    _harness,
    bounds.problems,
)
