"""Goodput simulator.

python -m experiments.simulate_goodput --config=configs/goodput.py --workdir=DIR
"""

from absl import app, flags
from ml_collections import config_flags

from diloco import paths
from diloco.config import cli as config_cli
from diloco.sim import goodput

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (get_config(arg)).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where goodput.json goes.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  paths.require_bucket(_WORKDIR.value, "--workdir")
  goodput.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  config_cli.run(main, like="configs/goodput.py")
