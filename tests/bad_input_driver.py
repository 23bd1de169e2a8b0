"""Runs mains (`experiments.<name>`) on several command lines in one process, as `python -m`
would run each, for tests/test_bad_input.py: one import of the libraries instead of one per
command (or per main).

  python tests/bad_input_driver.py CASES.json RESULTS.json

CASES.json is a list of {"main", "argv", "cwd", "out"}; for each, the main runs as __main__ with
that argv in that directory, its stdout and stderr going (file descriptors 1 and 2) to out.stdout
and out.stderr; RESULTS.json gets each exit code. The main's imports are imported first (their
flags, absl.app's among them, stay); the flags a command defines (the main's, and those of the
library functions it calls) are removed after it and the others (a library's that defines its own
on first use) are back at their defaults, so each command parses as in a fresh process.
"""

import ast
import importlib
import json
import os
import runpy
import sys

from absl import app, flags  # pylint: disable=unused-import  (app: its flags in the baseline)

# Flags the next command defines again: the main's (absl names a __main__ module by its file's
# path) and those of this repository's library functions.
OURS = (
    "__main__",
    "diloco",
    "experiments",
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


def _exit_code(e: SystemExit) -> int:
  if e.code is None:
    return 0
  return e.code if isinstance(e.code, int) else 1  # (sys.exit("text") prints it and exits 1)


def import_dependencies(main: str) -> None:
  """Imports what experiments/<main>.py imports (not the main itself)."""
  spec = importlib.util.find_spec(f"experiments.{main}")
  with open(spec.origin, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [node.module]
    else:
      continue
    for name in names:
      importlib.import_module(name)


def run_one(main: str, argv: list[str], cwd: str, out: str) -> int:
  """The exit code of `python -m experiments.<main> *argv` run here, its output in out.*."""
  import_dependencies(main)
  baseline = set(flags.FLAGS)
  saved = [os.dup(1), os.dup(2)]
  sys.stdout.flush(), sys.stderr.flush()
  with open(out + ".stdout", "wb") as o, open(out + ".stderr", "wb") as e:
    os.dup2(o.fileno(), 1), os.dup2(e.fileno(), 2)
  here = os.getcwd()
  try:
    os.chdir(cwd)
    sys.argv = [f"experiments/{main}.py", *argv]
    try:
      runpy.run_module(f"experiments.{main}", run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as stop:
      code = _exit_code(stop)
    except BaseException as error:  # pylint: disable=broad-except  (as an uncaught one: exit 1)
      sys.excepthook(type(error), error, error.__traceback__)
      code = 1
  finally:
    os.chdir(here)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(saved[0], 1), os.dup2(saved[1], 2)
    for fd in saved:
      os.close(fd)
    for name in set(flags.FLAGS) - baseline:
      if (flags.FLAGS.find_module_defining_flag(name) or "").startswith(OURS):
        delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
  return code


def main(cases_path: str, results_path: str) -> None:
  with open(cases_path, encoding="utf-8") as f:
    cases = json.load(f)
  codes = [run_one(c["main"], c["argv"], c["cwd"], c["out"]) for c in cases]
  with open(results_path, "w", encoding="utf-8") as f:
    json.dump(codes, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
