"""Plans a learner on a Cloud TPU slice from a CPU machine, before any slice exists:

  python -m experiments.plan --config=configs/shakespeare.py:model=180m --topology=v5p-8 \
      [--config.KEY=VALUE ...] [--mfu=0.462] [--vocab_size=32000] [--json=PLAN.json]

The learner's island is built as a run builds it (the same config resolution and checks, mesh,
shardings, dtype, remat and steps) from abstract state, and its train step, eval step and the
receive of its largest fragment are compiled by libtpu's TPU compiler for the slice (accelerator
types as the launchers take them: v4-8, v5litepod-8 or v5e-8, v5p-64, v6e-8, ...). It prints per
chip the arguments, outputs, temporaries and peak against the chip's HBM, the FLOPs and HBM traffic
of a step, the roofline step time, tokens/s at an MFU, the bandwidth M such learners need between
them (diloco/sim/bandwidth.py), their goodput under failures (diloco/sim/goodput.py) and the
synchronizer they need (diloco/plan/sync_load.py: state, merges per second at this machine's
measured merge rate, shards and cores, RAM, saves, restore; --sync_cores, --disk_gbps).
--vocab_size is the planned tokenizer's vocabulary (default: the config's tokenizer, bytes 256).

Exit codes: 0 the plan fits; 2 it does not fit, or its synchronizer shards cannot keep up (the
numbers and the keys that change them), or the
command cannot run as written (a bad key, topology or mesh), with nothing compiled or written;
69 (EX_UNAVAILABLE) libtpu is not installed, with the line that installs it.
"""

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from diloco import paths
from diloco.config import cli as config_cli
from diloco.plan import devices, make, report, sync_load

_CONFIG = config_flags.DEFINE_config_file("config", None, config_cli.HELP, lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "The slice's accelerator type, e.g. v5p-64.")
_MFU = flags.DEFINE_float(
    "mfu", report.DEFAULT_MFU, f"Model FLOPs utilisation ({report.MFU_SOURCE})."
)
_VOCAB = flags.DEFINE_integer("vocab_size", None, "The tokenizer's vocabulary (default: config's).")
_JSON = flags.DEFINE_string("json", "", "Also write the figures here as JSON (when it fits).")
_SYNC_CORES = flags.DEFINE_integer(
    "sync_cores", make.SYNC_CORES, "Cores of each synchronizer shard's host."
)
_DISK = flags.DEFINE_float(
    "disk_gbps", sync_load.DISK_BYTES_PER_S / 1e9, "The synchronizer host's disk, GB/s."
)
flags.mark_flags_as_required(["config", "topology"])
EXIT_NO_LIBTPU = 69


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:  # libtpu's and XLA's INFO lines drown the report
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if _JSON.value:
    paths.require_bucket(_JSON.value, "--json")
  try:
    plan = make.make_plan(
        config,
        _TOPOLOGY.value,
        vocab_size=_VOCAB.value,
        mfu=_MFU.value,
        sync_cores=_SYNC_CORES.value,
        disk_gbps=_DISK.value,
    )
  except devices.LibtpuMissing as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(EXIT_NO_LIBTPU)
  except ValueError as e:  # ConfigError included: exit 2 with its message
    config_cli.fail(str(e))
  print(make.summary(plan, config), flush=True)
  refused = make.refusal(plan, config)
  if refused:
    config_cli.fail(str(refused))
  if _JSON.value:
    paths.write_text(_JSON.value, json.dumps(report.figures(plan), indent=1))


if __name__ == "__main__":
  # The plan compiles for libtpu's described devices and runs nothing: JAX's own backend stays
  # the CPU, also where libtpu is installed on a machine without a TPU.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  config_cli.run(main)
