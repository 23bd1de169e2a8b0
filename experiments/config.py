"""Prints a config as it would run: every key, its value, where it came from, what it means and
what it accepts.

  python -m experiments.config --config=configs/shakespeare.py:mode=decoupled [--config.KEY=VALUE]

A key's source is `preset` when a mode, `runlocal` or another key filled it (diloco/config/resolve.py),
`explicit` when a variant, a flag or the file set it over its preset, and empty for a plain key.
A key's meaning and domain are those declared with it (diloco/config/keys.py, domains.py).
Problems the checks find (diloco/config/checks.py) follow the listing, and the exit code is 2.
"""

import sys

from absl import app
from ml_collections import config_flags

from diloco.config import checks, cli as config_cli, keys, resolve

_CONFIG = config_flags.DEFINE_config_file("config", None, config_cli.HELP, lock_config=True)


def listing(config) -> list[str]:
  """One line per leaf key: `key = value  [source]  # meaning; domain`."""
  rows = []
  for path, field in keys.leaves(resolve.resolve(config)):
    value = field.get() if hasattr(field, "get") else field
    source = resolve.source(field)
    meaning = keys.MEANINGS.get(path, "") or "(no meaning recorded)"
    if path in keys.DOMAINS:
      meaning += f"; {keys.DOMAINS[path].describe()}"
    rows.append((path, repr(value), f"[{source}]" if source else "", meaning))
  w_key = max(len(r[0]) for r in rows)
  w_val = min(max(len(r[1]) for r in rows), 28)
  return [f"{k:<{w_key}} = {v:<{w_val}} {s:<10} # {m}" for k, v, s, m in rows]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  print("\n".join(listing(config)), flush=True)
  if "mode" in config:
    problems = checks.problems_of(config)
    if problems:
      print(checks.ConfigError(problems, config), file=sys.stderr)
      sys.exit(config_cli.USAGE_ERROR)


if __name__ == "__main__":
  config_cli.run(main)
