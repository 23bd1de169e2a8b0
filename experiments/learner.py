"""A learner process: python -m experiments.learner --config=configs/shakespeare.py:mode=decoupled
--learner_id=0 --synchronizer=127.0.0.1:PORT --workdir=DIR (token in $DILOCO_TOKEN, or --token_from).

TLS trust (deploy.ca_cert) and limits come from the config's `deploy` section, overridden with
--config.deploy.KEY=VALUE. A multi-host learner sets --config.distributed=True on every host (JAX
finds its peers); to form one learner from several processes on one machine, give each
--coordinator=HOST:PORT --num_processes=N --process_id=i instead.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from diloco import paths
from diloco.config import cli as config_cli
from diloco.launch import cli
from diloco.rpc import learner_main, multihost
from diloco.runtime import preemption

_TOKEN = cli.define_token_flag()
_CONFIG = config_flags.DEFINE_config_file("config", None, config_cli.HELP)
_ID = flags.DEFINE_integer("learner_id", None, "This learner's index m in 0..outer.learners-1.")
_SYNC = flags.DEFINE_string(
    "synchronizer",
    None,
    "HOST:PORT of the synchronizer service; with outer.sync_shards=S, S of them, comma-separated "
    "in shard order.",
)
_WORKDIR = flags.DEFINE_string("workdir", None, "This learner's outputs and checkpoints.")
_COORD, _NPROC, _PID, _HEARTBEAT = multihost.define_cluster_flags("this learner")
flags.mark_flags_as_required(["config", "learner_id", "synchronizer", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  token = cli.read_token(_TOKEN)
  paths.require_bucket(_WORKDIR.value, "--workdir")
  cluster = learner_main.Cluster(_COORD.value, _NPROC.value, _PID.value, _HEARTBEAT.value)
  with preemption.a_failed_save_ends_the_job():
    s = learner_main.run(
        _CONFIG.value,
        _WORKDIR.value,
        learner_id=_ID.value,
        target=_SYNC.value,
        token=token,
        cluster=cluster,
    )
  if s["role"] == "follower":
    print(f"learner {_ID.value} process {s['process']}: followed {s['steps']} steps", flush=True)
    return
  print(
      f"learner {_ID.value}: {s['steps']} steps, settled={s['settled']}, restored from "
      f"step {s['restored_step']}"
      + (f"; stopped by SIGTERM, saved at step {s['steps']}" if s.get("saved_at_stop") else ""),
      flush=True,
  )
  sys.exit(preemption.exit_code(s))  # 75 when SIGTERM stopped it: the supervisor restarts it


if __name__ == "__main__":
  config_cli.run(main)
