"""What every main does with its `--config`: a typo in a key is one line, a bad config is one
message naming every bad key, a workdir that holds another run is refused, with no traceback."""

import importlib.util
import os
import re
import sys
from collections.abc import Callable

from absl import app, flags

from diloco import errors
from diloco.config import keys

USAGE_ERROR = 2  # the exit code of a command that cannot run as written
HELP = (
    "Config file (get_config(arg)); `python -m experiments.config --config=FILE[:variants]` "
    "lists every key with its value and meaning."
)


def load_module(path: str):
  """Imports a config file by path (as ml_collections' config_flags does)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist")
  name = "config_file_" + re.sub(r"\W", "_", os.path.abspath(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def unknown_override(argv: list[str], flag: str = "config") -> str | None:
  """The message for the first `--config.KEY=...` whose KEY the config file does not have. Called
  only when absl's parsing failed on an override, so a run loads its config file once."""
  spec = _flag_value(argv, flag)
  overrides = [a[len(flag) + 3 :].split("=", 1)[0] for a in argv if a.startswith(f"--{flag}.")]
  if not spec or not overrides:
    return None
  path, _, arg = spec.partition(":")
  try:
    config = load_module(path).get_config(arg or None)
  except Exception:  # pylint: disable=broad-except  (absl reports a file that does not load)
    return None
  for key in overrides:
    if not keys.has(config, key):
      return f"--{flag}.{key}: " + keys.unknown_key(config, key)
  return None


def _flag_value(argv: list[str], flag: str) -> str | None:
  for i, a in enumerate(argv):
    if a.startswith(f"--{flag}="):
      return a.split("=", 1)[1]
    if a == f"--{flag}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def run(main: Callable[[list[str]], None]) -> None:
  """app.run(main), with config mistakes reported as one message and exit code USAGE_ERROR."""

  def checked(argv):
    unloaded = _unloaded_config_file()
    if unloaded:
      fail(unloaded)
    try:
      return main(argv)
    except (errors.InputError, app.UsageError) as e:  # ConfigError and WorkdirError among them
      fail(str(e))

  app.run(checked, flags_parser=_parse_flags)


def _unloaded_config_file() -> str:
  """The message for a config file flag (ml_collections' config_flags) whose file did not load:
  it parses, and raises only when the main first reads it."""
  for name in flags.FLAGS:
    value = flags.FLAGS[name].value
    if type(value).__name__ == "_ErrorConfig":  # (config_flags' stand-in for a failed load)
      try:
        value.anything  # pylint: disable=pointless-statement  (raises the load's error)
      except OSError as e:
        return f"--{name}: {str(e).strip().splitlines()[-1].strip()}"
  return ""


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, with a value that does not parse (`--config.batch_size=abc`) or a key the
  config does not have a usage error (exit 2, one line) rather than absl's exit 1 or a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:  # one line (absl names each missing flag on a line of its own)
    fail("; ".join(line.strip() for line in str(e).splitlines() if line.strip()))
  except (AttributeError, KeyError):  # ml_collections: an override of a key it does not have
    message = unknown_override(argv)
    if message is None:
      raise
    fail(message)


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(USAGE_ERROR)
