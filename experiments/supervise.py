"""Run a command under a restart loop: python -m experiments.supervise [--max_restarts=20]
[--backoff_s=5] [--log=FILE] -- COMMAND ARGS...

A COMMAND that exits 0 is done; any other exit restarts it after a backoff that doubles up to
--max_backoff_s (diloco/launch/supervisor.py). The launchers start every learner and the
synchronizer this way, so a process that dies comes back and rejoins from its checkpoint.
"""

import shutil
import sys

from absl import app, flags

from diloco import errors, paths
from diloco.config import cli as config_cli
from diloco.launch import supervisor

_MAX = flags.DEFINE_integer("max_restarts", 20, "Restarts before giving up (-1: never).")
_BACKOFF = flags.DEFINE_float("backoff_s", 5.0, "First delay before a restart, in seconds.")
_MAX_BACKOFF = flags.DEFINE_float("max_backoff_s", 300.0, "Longest delay before a restart.")
_RESET = flags.DEFINE_float("reset_after_s", 600.0, "A run this long resets the delay.")
_LOG = flags.DEFINE_string("log", "", "JSON lines of every start and exit (empty: none).")


def main(argv):
  if len(argv) < 2:
    raise app.UsageError("give the command to supervise after --")
  if shutil.which(argv[1]) is None:  # (a path that is not there, or a name not on PATH)
    raise errors.MissingInput(f"{argv[1]}: no such command (not an executable file, nor on PATH)")
  if _LOG.value:
    paths.require_bucket(_LOG.value, "--log")
  policy = supervisor.Policy(_MAX.value, _BACKOFF.value, _MAX_BACKOFF.value, _RESET.value)
  sys.exit(supervisor.main(argv[1:], policy, _LOG.value))


if __name__ == "__main__":
  config_cli.run(main)
