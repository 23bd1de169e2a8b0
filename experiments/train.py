"""Trains a model: python -m experiments.train --config=configs/shakespeare.py --workdir=DIR."""

from absl import app, flags, logging
from ml_collections import config_flags

from diloco import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (get_config(arg)).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where outputs and checkpoints go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:  # the libraries' INFO logs drown the progress bar
    logging.set_verbosity(logging.WARNING)
  summary = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  print(train.format_summary(summary), flush=True)


if __name__ == "__main__":
  app.run(main)
