"""Config keys declared once: value, meaning, domain, and the layers that fill a preset key.

A config file defines each key once, with its value, a one-line meaning and, where it has one,
its domain (diloco/config/domains.py):

  c.optimizer = keys.section("optimizer", lr=(keys.Auto(1e-2), "peak inner lr", domains.positive()))

`MEANINGS` and `DOMAINS` collect them by dotted path as sections are defined (`experiments.config`
lists them, `checks` tests every key against its domain). An `Auto` key holds a value that
`diloco/config/resolve.py` fills from the run's layers, all declared on the key: its `runlocal`
value (for every mode, or per mode: `local`), its value for the mode (keyword arguments), for the
recipe (`recipes`), a derivation from other keys (`derive`), else its default. It does so until
the key is given explicitly: by a variant after the colon, a `--config.` flag, a sweep point or
code setting it. From then on the resolver leaves it alone, whichever way it was given.
"""

from collections.abc import Callable
from typing import Any

import ml_collections
from ml_collections import config_dict

MEANINGS: dict[str, str] = {}  # dotted path -> one-line meaning, as sections are defined
DOMAINS: dict[str, Any] = {}  # dotted path -> its domains.Domain, for keys declared with one
# Keys of an invocation, not of the run: how it is watched and where this invocation stops. A run
# resumes under other values of them (the workdir's claim and the virtual snapshot ignore them).
INVOCATION = ("stop_after_steps", "progress_bar", "timeline", "trackers")


class _Unset:
  """'No value in this layer'; one object, also after pickling (sweeps' worker processes)."""

  def __reduce__(self):
    return "_UNSET"

  def __repr__(self):
    return "unset"


_UNSET = _Unset()


class Auto(config_dict.FieldReference):
  """A key filled by the resolver (`fill`) until set explicitly (`set`, any way a value comes).

  Its layers: `runlocal` (every mode) or `local[mode]` under `runlocal`; `modes[mode]`;
  `recipes[recipe]`; `derive(config)`, a module-level function (configs are pickled); the default.
  """

  def __init__(
      self,
      default: Any,
      runlocal: Any = _UNSET,
      field_type: type | None = None,
      *,
      local: dict[str, Any] | None = None,
      recipes: dict[str, Any] | None = None,
      derive: Callable[[Any], Any] | None = None,
      **modes,
  ):
    super().__init__(default, field_type=field_type or type(default))
    self.default, self.runlocal, self.modes = default, runlocal, modes
    self.local, self.recipes, self.derive = dict(local or {}), dict(recipes or {}), derive
    self.explicit = False

  def set(self, value: Any, type_safe: bool = True) -> None:
    super().set(value, type_safe)
    self.explicit = True

  def fill(self, value: Any) -> None:
    """Sets the value as the resolver's, not the user's (a later `set` still wins)."""
    super().set(value)
    self.explicit = False

  def redefine(self, default: Any = _UNSET, runlocal: Any = _UNSET, **modes) -> None:
    """A config file built on another changes this key's default and layers (not explicit)."""
    if default is not _UNSET:
      self.default = default
      self.fill(default)
    if runlocal is not _UNSET:
      self.runlocal = runlocal
    self.modes.update(modes)

  def _state(self) -> tuple:
    return (
        self.default,
        self.runlocal,
        self._field_type,
        dict(self.modes),
        self.get(),
        self.explicit,
        (self.local, self.recipes, self.derive),
    )

  def __deepcopy__(self, memo):
    return _rebuild(*self._state())

  def __reduce__(self):
    return _rebuild, self._state()


def _rebuild(default, runlocal, field_type, modes, value, explicit, layers) -> Auto:
  local, recipes, derive = layers
  out = Auto(default, runlocal, field_type, local=local, recipes=recipes, derive=derive, **modes)
  config_dict.FieldReference.set(out, value)
  out.explicit = explicit
  return out


def unset() -> Any:
  """The marker for 'no value in this layer'."""
  return _UNSET


def section(path: str, **fields: tuple) -> ml_collections.ConfigDict:
  """A ConfigDict of `name=(value, meaning)` or `(value, meaning, domain)`; records each meaning
  (and domain) under `path.name`."""
  out = ml_collections.ConfigDict()
  for name, spec in fields.items():
    ok = isinstance(spec, tuple) and len(spec) in (2, 3) and isinstance(spec[1], str) and spec[1]
    if not ok or (len(spec) == 3 and not hasattr(spec[2], "problem")):
      raise TypeError(
          f"{_join(path, name)}: define a key as (value, 'its meaning'[, domain]), got {spec!r}"
      )
    MEANINGS[_join(path, name)] = spec[1]
    if len(spec) == 3:
      DOMAINS[_join(path, name)] = spec[2]
    out[name] = spec[0]
  return out


def auto_of(c: ml_collections.ConfigDict, path: str) -> Auto:
  """The Auto object behind dotted `path` of `c` (TypeError if that key is not one)."""
  *parents, leaf = path.split(".")
  node = c
  for p in parents:
    node = node[p]
  ref = node._fields.get(leaf)  # pylint: disable=protected-access
  if not isinstance(ref, Auto):
    raise TypeError(f"config key {path!r} is not filled by presets (not an Auto key)")
  return ref


def leaves(c: ml_collections.ConfigDict, prefix: str = "") -> list[tuple[str, Any]]:
  """(dotted path, field) for every leaf, in definition order; fields keep their Auto objects."""
  out = []
  for name, field in c.items(preserve_field_references=True):
    path = _join(prefix, name)
    if isinstance(field, ml_collections.ConfigDict):
      out += leaves(field, path)
    else:
      out.append((path, field))
  return out


def unknown_key(c: ml_collections.ConfigDict, path: str) -> str:
  """The one-line message for a key `c` does not have, with the nearest known key."""
  import difflib  # pylint: disable=import-outside-toplevel

  known = [p for p, _ in leaves(c)]
  near = difflib.get_close_matches(path, known, n=1, cutoff=0.6)
  hint = f"; did you mean {near[0]!r}?" if near else ""
  return f"unknown config key {path!r}{hint} (python -m experiments.config lists every key)"


def has(c: ml_collections.ConfigDict, path: str) -> bool:
  """Whether dotted `path` is a key (leaf or section) of `c`."""
  node = c
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    node = node[part]
  return True


def _join(path: str, name: str) -> str:
  return f"{path}.{name}" if path else name
