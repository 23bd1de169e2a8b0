"""Chaos suite: python -m experiments.chaos_suite --config=configs/chaos_suite.py --workdir=DIR."""

from absl import app, flags, logging
from ml_collections import config_flags

from diloco import paths
from diloco.config import cli as config_cli
from experiments.studies import chaos_suite

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (get_config(arg)).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the runs and the table go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax reports every checkpoint at INFO
  try:
    workdir = paths.local_only(_WORKDIR.value, "the chaos suite")
  except ValueError as err:
    raise app.UsageError(str(err)) from None
  try:  # the config file each run starts from, by path as --config is
    get_base = config_cli.load_module(_CONFIG.value.base_file).get_config
  except FileNotFoundError as err:
    raise app.UsageError(f"base_file: {err}") from None
  summary = chaos_suite.run(_CONFIG.value, workdir, get_base)
  print(summary["table"], flush=True)
  print(f"wall {summary['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
  flags.FLAGS.set_default("verbosity", -1)
  config_cli.run(main, like="configs/chaos_suite.py")
