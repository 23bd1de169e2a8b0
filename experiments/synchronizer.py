"""The synchronizer process: python -m experiments.synchronizer --config=configs/shakespeare.py:...
--port=PORT --workdir=DIR (token in $DILOCO_TOKEN; binds 127.0.0.1 unless --bind says otherwise)."""

import os

from absl import app, flags, logging
from ml_collections import config_flags

from diloco.rpc import limits as limits_lib, sync_main

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (get_config(arg)).")
_PORT = flags.DEFINE_integer("port", 0, "Port to listen on; 0 = a free one (written to WORKDIR/port).")
_BIND = flags.DEFINE_string("bind", "127.0.0.1", "Address to bind; loopback unless told otherwise.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and summary.json.")
_CERT = flags.DEFINE_string("cert", "", "TLS certificate (PEM); with --key enables TLS.")
_KEY = flags.DEFINE_string("key", "", "TLS private key (PEM).")
_ABSENT = flags.DEFINE_float("absent_after_s", 5.0, "Silent learners are absent after this.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  token = os.environ.get("DILOCO_TOKEN", "")
  if not token:
    raise app.UsageError("set DILOCO_TOKEN to the shared secret learners must present")
  s = sync_main.run(_CONFIG.value, _WORKDIR.value, port=_PORT.value, token=token,
                    bind=_BIND.value, cert=_CERT.value, key=_KEY.value,
                    limits=limits_lib.Limits(absent_after_s=_ABSENT.value))
  print(f"synchronizer: {s['merges']} merges, generation {s['generation']}", flush=True)


if __name__ == "__main__":
  app.run(main)
