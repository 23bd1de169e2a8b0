"""Sweeps as config: a config file's `get_sweep(arg)` lists points, each a dict of overrides.

A point mirrors a command line. Keys that start with `config.` override a key of the built config
(`--config.outer.lr=0.4`); every other key is a variant of the file (`FILE:mode=diloco`), so
presets that set several keys at once (a mode, a model size) are swept like anything else:

  def get_sweep(arg):
    return [{"mode": "diloco", "learners": m, "config.outer.lr": lr, "seed": 0}
            for m in (2, 4) for lr in (0.4, 0.8)]

`get_sweep` takes the variants after the colon of `--config=FILE[:variants]`; so does
`get_config`, together with each point's own variants (the point's win). Every point is resolved
and checked before anything runs (diloco/config/checks.py): an unknown variant or config key, a bad
value, or a variant the file's get_config does not use (the config is the same whatever its value)
fails, naming the point and the key.
"""

import dataclasses
import hashlib
import os
import re
import shlex
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import ml_collections

from diloco.config import checks, cli as config_cli, keys, resolve

CONFIG_PREFIX = "config."
SEP = "+"  # between a point's key=value pairs in its directory name


class SweepError(ValueError):
  """A sweep that cannot run as written (raised before any point runs)."""


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of a sweep."""

  index: int
  name: str  # its sub-directory of the sweep's workdir
  values: dict[str, Any]  # as get_sweep returned it (the results table's columns)
  spec: str  # FILE:variants, the --config argument of this point
  overrides: dict[str, Any]  # config key (without `config.`) -> value
  config: ml_collections.ConfigDict | None = None  # built once, when the sweep is checked

  def flags(self) -> list[str]:
    """The --config.KEY=VALUE flags of this point."""
    return [f"--{CONFIG_PREFIX}{k}={_text(v)}" for k, v in self.overrides.items()]

  def command(self, workdir: str) -> str:
    """The one-run command line equivalent to this point."""
    args = [sys.executable, "-m", "experiments.train", f"--config={self.spec}"]
    args += self.flags() + [f"--workdir={os.path.join(workdir, self.name)}"]
    return shlex.join(args)


def split_spec(spec: str) -> tuple[str, str]:
  """'FILE[:variants]' -> (FILE, variants)."""
  path, _, arg = spec.partition(":")
  return path, arg


def load_module(path: str) -> ModuleType:
  """Imports a config file by path (as `config_flags` does)."""
  try:
    return config_cli.load_module(path)
  except FileNotFoundError as e:
    raise SweepError(str(e)) from e


MAX_NAME = 80  # longer names keep only the overrides that vary between points, and a digest


def point_name(values: dict[str, Any], shared: Sequence[str] = ()) -> str:
  """A directory name from a point's overrides, in their order: `mode=diloco+outer.lr=0.4`.

  A name longer than MAX_NAME leaves out the `shared` keys (the same value in every point of the
  sweep) and ends in `~` and 8 hex digits of the whole name, so it stays short and unique."""
  name = _joined(values.items())
  if len(name) <= MAX_NAME or not shared:
    return name
  digest = hashlib.sha256(name.encode()).hexdigest()[:8]
  return _joined((k, v) for k, v in values.items() if k not in shared) + f"~{digest}"


def _joined(items) -> str:
  parts = []
  for k, v in items:
    key = k[len(CONFIG_PREFIX) :] if k.startswith(CONFIG_PREFIX) else k
    parts.append(f"{key}={_text(v)}")
  name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", SEP.join(parts))
  return name or "default"


def shared_keys(raw: list[dict[str, Any]]) -> list[str]:
  """The keys every point sets to the same value."""
  first = raw[0] if raw else {}
  return [k for k in first if all(k in p and repr(p[k]) == repr(first[k]) for p in raw)]


def points(spec: str, module: ModuleType | None = None) -> list[Point]:
  """The points of `spec`'s get_sweep, each checked against the config it builds (`module`: the
  file, if already loaded)."""
  path, arg = split_spec(spec)
  module = module or load_module(path)
  missing = [f for f in ("get_config", "get_sweep") if not hasattr(module, f)]
  if missing:
    raise SweepError(
        f"{path} defines no {' and no '.join(missing)}: a sweep file defines get_config(arg) "
        "(one run's config) and get_sweep(arg) (the points: a list of dicts)"
    )
  raw = module.get_sweep(arg or None)
  if not isinstance(raw, list) or not raw:
    raise SweepError(f"{path}: get_sweep({arg!r}) must return a non-empty list of dicts")
  out, seen = [], {}
  bad = [i for i, values in enumerate(raw) if not isinstance(values, dict)]
  if bad:
    raise SweepError(f"point {bad[0]} of {path} is a {type(raw[bad[0]]).__name__}, not a dict")
  # A file's UNNAMED_KEYS stay out of the directory names (a path that depends on where the sweep
  # runs, such as `config.init_from` under its workdir): the names, hence the results, travel.
  unnamed = tuple(getattr(module, "UNNAMED_KEYS", ()))
  named = [{k: v for k, v in values.items() if k not in unnamed} for values in raw]
  shared = shared_keys(named)
  for i, values in enumerate(raw):
    name = point_name(named[i], shared)
    if name in seen:
      raise SweepError(f"points {seen[name]} and {i} are the same run ({name})")
    seen[name] = i
    point = _point(i, name, path, arg, values)
    # Built now: a bad point fails before any runs, and editing the file mid-sweep changes nothing.
    config = build_config(point, module)
    for key in unused_variants(point, module):
      raise SweepError(
          f"point {i} ({name}): variant {key!r} changes nothing in the config it produces "
          f"({path}'s get_config does not use it); drop it or set a config key (config.KEY)"
      )
    out.append(dataclasses.replace(point, config=config))
  return out


def _point(i: int, name: str, path: str, arg: str | None, values: dict[str, Any]) -> Point:
  variants = [f"{k}={_text(v)}" for k, v in values.items() if not k.startswith(CONFIG_PREFIX)]
  overrides = {k[len(CONFIG_PREFIX) :]: v for k, v in values.items() if k.startswith(CONFIG_PREFIX)}
  point_arg = ",".join([a for a in (arg,) if a] + variants)
  return Point(i, name, dict(values), f"{path}:{point_arg}" if point_arg else path, overrides)


def unused_variants(point: Point, module: ModuleType) -> list[str]:
  """The point's variants whose value the config does not depend on: with the value changed
  (a probe), get_config gives the same resolved config (a probe it refuses counts as used)."""
  path, arg = split_spec(point.spec)
  base = _build(point, module).to_json()
  out = []
  for key, value in point.values.items():
    if key.startswith(CONFIG_PREFIX):
      continue
    if all(_same(base, point, path, arg, module, key, v) for v in _probes(value)):
      out.append(key)
  return out


def _same(base: str, point: Point, path: str, arg: str, module, key: str, value: Any) -> bool:
  """Whether the point with `key` set to `value` builds the config `base` (JSON)."""
  probe = _point(point.index, point.name, path, arg, {**point.values, key: value})
  try:
    return _build(probe, module).to_json() == base
  except Exception:  # pylint: disable=broad-except  (the file read the value and refused it)
    return False


def _probes(value: Any) -> list[Any]:
  """Other values of the same type (an int may stand for a flag: both neighbours)."""
  if isinstance(value, bool):
    return [not value]
  if isinstance(value, int):
    return [value + 1, value - 1]
  if isinstance(value, float):
    return [value * 2 + 1, value / 2 - 1]
  return [f"{value}_probe"]


def declare(point: Point) -> None:
  """Builds the point's config file's config once in this process, unused: its keys' meanings
  and domains are recorded as its sections are defined (keys.MEANINGS, keys.DOMAINS), which a
  config received pickled (a spawned worker's) does not do, and the checks read them."""
  path, arg = split_spec(point.spec)
  load_module(path).get_config(arg or None)


def build_config(point: Point, module: ModuleType | None = None) -> ml_collections.ConfigDict:
  """The config of one point: get_config(its variants), then its config overrides."""
  if point.config is not None:
    return point.config
  module = module or load_module(split_spec(point.spec)[0])
  try:
    config = _build(point, module)
  except (ValueError, KeyError) as e:
    raise SweepError(f"point {point.index} ({point.name}): {e}") from e
  if "mode" in config:
    try:
      checks.check(config)
    except checks.ConfigError as e:
      raise SweepError(f"point {point.index} ({point.name}): {e}") from e
  if "progress_bar" in config:  # the sweep draws one bar over its points
    config.progress_bar = False
  return config


def _build(point: Point, module: ModuleType) -> ml_collections.ConfigDict:
  """get_config(the point's variants), its config overrides, resolved (not checked)."""
  config = module.get_config(split_spec(point.spec)[1] or None)
  for key, value in point.overrides.items():
    if not keys.has(config, key):
      raise ValueError(keys.unknown_key(config, key))
    try:
      _set(config, key, value)
    except (KeyError, AttributeError, TypeError) as e:
      raise ValueError(f"cannot set config key {key!r} to {value!r}: {e}") from e
  return resolve.resolve(config) if "mode" in config else config


def _set(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
  *parents, leaf = key.split(".")
  node = config
  for p in parents:
    if p not in node or not isinstance(node[p], ml_collections.ConfigDict):
      raise KeyError(f"no section {p!r}")
    node = node[p]
  if leaf not in node:
    raise KeyError(f"no key {leaf!r}")
  node[leaf] = value


def set_from_text(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
  """Sets `key` from a command line's text, typed like the value it replaces."""
  *parents, leaf = key.split(".")
  node = config
  for p in parents:
    node = node[p]
  old = node[leaf]
  if isinstance(old, bool):
    value = raw.lower() in ("true", "1")
  elif old is None or isinstance(old, str):
    value = raw
  else:
    value = type(old)(raw)
  _set(config, key, value)


def _text(v: Any) -> str:
  return str(v).lower() if isinstance(v, bool) else str(v)
