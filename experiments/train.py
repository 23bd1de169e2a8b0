"""Trains a model: python -m experiments.train --config=configs/shakespeare.py --workdir=DIR.

Exit codes: 0 when the run finished or stopped at `stop_after_steps`; 75 (EX_TEMPFAIL,
diloco.runtime.preemption.EXIT_PREEMPTED) when SIGTERM or SIGINT stopped it at a step boundary
with a checkpoint (summary.json says `finished: false`): run the same command again to resume;
2: the command cannot run as written (an unknown key, a bad config, a workdir that holds another
run), with one message and nothing written; anything else is an error.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from diloco import train
from diloco.config import cli as config_cli
from diloco.rpc import multihost
from diloco.runtime import preemption

_CONFIG = config_flags.DEFINE_config_file("config", None, config_cli.HELP, lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where outputs and checkpoints go.")
_RESTART = flags.DEFINE_bool(
    "restart",
    False,
    "Start over in a workdir that holds a run: the old run is moved to WORKDIR.old-N, never "
    "deleted (without it, a workdir with another config is refused, listing the keys that differ).",
)
_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID, _HEARTBEAT = multihost.define_cluster_flags("this run")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:  # the libraries' INFO logs drown the progress bar
    logging.set_verbosity(logging.WARNING)
  if _COORDINATOR.value:  # a multi-process run: config.distributed follows
    if "distributed" not in _CONFIG.value:
      raise app.UsageError(
          "--coordinator starts a multi-process run: the config has no distributed"
      )
    _CONFIG.value.distributed = True
    multihost.initialize(
        True, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _HEARTBEAT.value
    )
  with preemption.stop_on_signals():  # a signal while it sets up stops it after its first step
    with preemption.a_failed_save_ends_the_job():
      summary = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value, restart=_RESTART.value)
  print(train.format_summary(summary), flush=True)
  sys.exit(preemption.exit_code(summary))  # 75: stopped on a signal, restart me


if __name__ == "__main__":
  config_cli.run(main)
