"""A learner process: python -m experiments.learner --config=configs/shakespeare.py:mode=decoupled
--learner_id=0 --synchronizer=127.0.0.1:PORT --workdir=DIR (token in $DILOCO_TOKEN)."""

import os

from absl import app, flags, logging
from ml_collections import config_flags

from diloco.rpc import learner_main

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (get_config(arg)).")
_ID = flags.DEFINE_integer("learner_id", None, "This learner's index m in 0..outer.learners-1.")
_SYNC = flags.DEFINE_string("synchronizer", None, "HOST:PORT of the synchronizer service.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where this learner's outputs go.")
_CA = flags.DEFINE_string("ca_cert", "", "Trust this certificate (TLS); empty: plaintext.")
flags.mark_flags_as_required(["config", "learner_id", "synchronizer", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  token = os.environ.get("DILOCO_TOKEN", "")
  if not token:
    raise app.UsageError("set DILOCO_TOKEN to the synchronizer's shared secret")
  s = learner_main.run(_CONFIG.value, _WORKDIR.value, learner_id=_ID.value,
                       target=_SYNC.value, token=token, ca_cert=_CA.value)
  print(f"learner {_ID.value}: {s['steps']} steps, settled={s['settled']}", flush=True)


if __name__ == "__main__":
  app.run(main)
