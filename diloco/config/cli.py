"""What every main does with its `--config`: a typo in a key is one line, a bad config is one
message naming every bad key, a workdir that holds another run is refused, with no traceback."""

import contextlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable

from absl import app, flags

from diloco import errors
from diloco.config import keys

USAGE_ERROR = 2  # the exit code of a command that cannot run as written
HELP = (
    "Config file (get_config(arg)); `python -m experiments.config --config=FILE[:variants]` "
    "lists every key with its value and meaning."
)


@contextlib.contextmanager
def _no_bytecode():
  """Config files load without writing a __pycache__ beside them: a command writes nothing in the
  folder of the config file it was given (a bad one least of all)."""
  before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
  try:
    yield
  finally:
    sys.dont_write_bytecode = before


def load_module(path: str):
  """Imports a config file by path (as ml_collections' config_flags does)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist")
  name = "config_file_" + re.sub(r"\W", "_", os.path.abspath(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  with _no_bytecode():
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


def run(main: Callable[[list[str]], None], like: str | None = None) -> None:
  """app.run(main), with config mistakes reported as one message and exit code USAGE_ERROR.
  `like`: the config file (from the repository's root) whose top-level keys the main reads; a
  `--config` without them (another command's config) is refused naming them."""

  def checked(argv):
    unloaded = _unloaded_config_file() or (like and _unlike(like))
    if unloaded:
      fail(unloaded)
    try:
      return main(argv)
    except (errors.InputError, app.UsageError) as e:  # ConfigError and WorkdirError among them
      fail(str(e))
    except Exception as e:  # pylint: disable=broad-except  (a config file a main loads itself)
      message = config_file_error(sys.argv, e)
      if message is None:
        raise
      fail(message)

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


def _unlike(like: str, flag: str = "config") -> str:
  """The message for a `--config` that lacks top-level keys of the config file `like`."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  wanted = load_module(os.path.join(root, like)).get_config()
  given = flags.FLAGS[flag].value
  missing = [k for k in wanted if k not in given]
  if not missing:
    return ""
  shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
  return (
      f"--{flag}={flags.FLAGS[flag].config_filename}: not a config of this command (no {shown}; "
      f"{like} is one)"
  )


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, with a value that does not parse (`--config.batch_size=abc`), a key the
  config does not have, or a config file that raises as it loads a usage error (exit 2, one line)
  rather than absl's exit 1 or a traceback."""
  try:
    with _no_bytecode():  # (config_flags loads the config files as it parses)
      return flags.FLAGS(argv)
  except flags.Error as e:  # one line (absl names each missing flag on a line of its own)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if "Traceback (most recent call last):" in lines:  # (config_flags': a get_config that raised)
      lines = [" ".join([*lines[: lines.index("Traceback (most recent call last):")], lines[-1]])]
    fail("; ".join(lines))
  except Exception as e:  # pylint: disable=broad-except  (re-raised unless the config file's)
    message = unknown_override(argv) if isinstance(e, (AttributeError, KeyError)) else None
    message = message or config_file_error(argv, e)
    if message is None:
      raise
    fail(message)


def config_file_error(argv: list[str], error: BaseException, flag: str = "config") -> str | None:
  """One line for an error that the config file itself raised as it loaded (a SyntaxError in it,
  or an exception with a frame of it: a typo in get_config), naming the file, line and error."""
  spec = _flag_value(argv, flag)
  if not spec:
    return None
  path = spec.partition(":")[0]
  if isinstance(error, SyntaxError) and error.filename:
    if os.path.abspath(error.filename) == os.path.abspath(path):
      return f"--{flag}: {path} line {error.lineno}: SyntaxError: {error.msg}"
    return None
  frames = traceback.extract_tb(error.__traceback__)
  mine = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)]
  if not mine:
    return None
  first = (str(error).strip().splitlines() or [""])[0]
  return f"--{flag}: {path} line {mine[-1].lineno}: {type(error).__name__}: {first}"


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(USAGE_ERROR)
