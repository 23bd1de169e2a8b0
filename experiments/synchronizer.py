"""The synchronizer process: python -m experiments.synchronizer --config=configs/shakespeare.py:...
--workdir=DIR [--config.deploy.port=PORT] [--shard=s] (token in $DILOCO_TOKEN, or --token_from).

With --config.outer.sync_shards=S > 1, run S of them, --shard=0..S-1, each with its own workdir
(its checkpoints, generation and status): shard s owns the fragments `ownership.owners` gives it.

Where it listens, TLS and limits come from the config's `deploy` section (diloco/config/deploy.py),
overridden as usual with --config.deploy.KEY=VALUE: it binds deploy.bind (127.0.0.1 unless told
otherwise) on deploy.port (0: a free one, written to WORKDIR/port).
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from diloco import paths
from diloco.config import cli as config_cli
from diloco.launch import cli
from diloco.rpc import sync_main
from diloco.runtime import preemption

_TOKEN = cli.define_token_flag()
_CONFIG = config_flags.DEFINE_config_file("config", None, config_cli.HELP)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and summary.json.")
_PORT = flags.DEFINE_integer("port", None, "Shorthand for --config.deploy.port.")
_SHARD = flags.DEFINE_integer(
    "shard", None, "With outer.sync_shards=S > 1: the shard this process serves, 0..S-1."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  token = cli.read_token(_TOKEN)
  paths.require_bucket(_WORKDIR.value, "--workdir")
  config = _CONFIG.value
  if _PORT.value is not None:
    config.deploy.port = _PORT.value
  try:
    s = sync_main.run(config, _WORKDIR.value, token=token, shard=_SHARD.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  print(
      f"synchronizer shard {s['shard']} (fragments {s['owned']}): {s['merges']} merges, "
      f"generation {s['generation']}",
      flush=True,
  )
  sys.exit(preemption.exit_code(s))  # 75 when SIGTERM stopped it (its state saved at the stop)


if __name__ == "__main__":
  config_cli.run(main)
