"""Keeps finished runs safe: a workdir that holds another run is refused, or moved aside whole.

`claim(workdir, config)` decides before anything is written: an empty or missing workdir (or one
with neither config.json nor run outputs) is "new"; one whose config.json equals this run's config
is "resume"; one that holds a run with another config, or run outputs without a config.json, is
refused with a `WorkdirError` listing the differing keys. `restart=True` instead renames a workdir
that holds any run (same config or not) to the first free sibling `<workdir>.old-<N>`
("restarted"; nothing is ever deleted), so that the caller starts in an empty one.
`write_config` then writes config.json atomically.

Configs compare as JSON writes them: nested dicts are flattened to dotted keys, and two values are
equal when their JSON texts are, so a tuple equals a list of the same items, while 1 and 1.0 (or 1
and true) differ.
"""

import json
import os
from typing import Any

CONFIG = "config.json"
RUN_OUTPUTS = ("summary.json", "metrics.jsonl", "checkpoints")  # any one means a run was here
MAX_LINES = 20  # differing keys listed in a refusal; the rest are counted
_ABSENT = "(absent)"
_MAX_VALUE_CHARS = 80


class WorkdirError(ValueError):
  """The workdir holds another run; the message says how to start over or where else to go."""


def _flatten(tree: Any, prefix: str = "") -> dict[str, str]:
  """Dotted key -> the value's JSON text; an empty dict is a value of its own."""
  if isinstance(tree, dict) and tree:
    out = {}
    for k, v in tree.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: json.dumps(tree, sort_keys=True)}


def _differences(old: dict, new: dict) -> list[str]:
  """`key: old -> new` for each dotted key whose JSON differs (`(absent)` on a missing side)."""
  a, b = _flatten(json.loads(json.dumps(old))), _flatten(json.loads(json.dumps(new)))
  show = lambda v: v if len(v) <= _MAX_VALUE_CHARS else v[: _MAX_VALUE_CHARS - 3] + "..."
  return [
      f"{k}: {show(a.get(k, _ABSENT))} -> {show(b.get(k, _ABSENT))}"
      for k in sorted(a.keys() | b.keys())
      if a.get(k) != b.get(k)
  ]


def _aside_path(workdir: str) -> str:
  """The first free `<workdir>.old-<N>`, N from 1."""
  n = 1
  while os.path.lexists(f"{workdir}.old-{n}"):
    n += 1
  return f"{workdir}.old-{n}"


def _refusal(workdir: str, why: str, lines: list[str]) -> WorkdirError:
  shown = [f"  {line}" for line in lines[:MAX_LINES]]
  if len(lines) > MAX_LINES:
    shown.append(f"  and {len(lines) - MAX_LINES} more")
  return WorkdirError(
      "\n".join(
          [
              f"workdir {workdir} {why}" + (":" if shown else "."),
              *shown,
              f"To start over, pass --restart: it moves the old run to {_aside_path(workdir)}"
              " (nothing is deleted). Or pick another --workdir.",
          ]
      )
  )


def _read_config(path: str) -> dict | None:
  """The saved config, or None when it cannot be read as a JSON object."""
  try:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return None
  return saved if isinstance(saved, dict) else None


def _held_run(
    workdir: str, config: dict, ignore: tuple[str, ...] = ()
) -> tuple[str, list[str]] | None:
  """None when `workdir` holds no run; else why this run may not resume it ("" when it may) and
  the differing keys."""
  if os.path.lexists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"workdir {workdir} exists and is not a directory; pick another --workdir")
  names = set(os.listdir(workdir)) if os.path.isdir(workdir) else set()
  outputs = sorted(names.intersection(RUN_OUTPUTS))
  if CONFIG in names:
    saved = _read_config(os.path.join(workdir, CONFIG))
    if saved is None:
      return f"holds a run whose {CONFIG} is not a readable JSON object", []
    lines = [d for d in _differences(saved, config) if d.split(":", 1)[0] not in ignore]
    why = f"holds a run whose {CONFIG} differs from this run's config (workdir's -> this run's)"
    return (why if lines else ""), lines
  if outputs:
    return f"holds a run without {CONFIG} ({', '.join(outputs)} found)", []
  return None


def claim(workdir: str, config: dict, restart: bool = False, ignore: tuple[str, ...] = ()) -> str:
  """Returns "new", "resume" or "restarted" (see the module doc); WorkdirError when refused.

  Writes nothing, except the rename of the whole workdir when `restart` moves an old run aside.
  `ignore`: dotted keys that may differ on a resume (how a run is watched, where it stops).
  """
  workdir = os.path.abspath(workdir)
  held = _held_run(workdir, config, ignore)
  if held is None:
    return "new"
  why, lines = held
  if not restart:
    if not why:
      return "resume"
    raise _refusal(workdir, why, lines)
  os.rename(workdir, _aside_path(workdir))
  return "restarted"


def write_config(workdir: str, config_json: str) -> None:
  """Writes `config_json` to `<workdir>/config.json` atomically, creating the directory."""
  os.makedirs(workdir, exist_ok=True)
  tmp = os.path.join(workdir, f".{CONFIG}.tmp{os.getpid()}")
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(config_json)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, os.path.join(workdir, CONFIG))
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
