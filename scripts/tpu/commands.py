"""Commands to run the gRPC runtime on Cloud TPU VMs: one learner per slice, one synchronizer.

  python scripts/tpu/commands.py --config=configs/shakespeare.py:mode=decoupled \
      --config.outer.learners=2 --config.deploy.port=50051 \
      --config.deploy.tpu.project=my-proj --config.deploy.tpu.zone=us-central2-b \
      --config.deploy.tpu.accelerator_type=v4-8 --config.deploy.tpu.sync_host=10.0.0.2 \
      [--config.deploy.tpu.sync_vm=diloco-sync] [--run]

Everything comes from the config's `deploy` section (diloco/config/deploy.py), overridden with
--config.KEY=VALUE flags; those overrides are passed on to the synchronizer and every learner.
Without --run it prints the commands (a dry run; tests/test_launch.py checks them). With --run the
token is taken from $DILOCO_TOKEN and written to the stage's mode-600 file, which goes to each host
beside a pack of the code (diloco/launch/staging.py); it is never on a command line. Slices are
created if absent; each worker installs the package with the `tpu` extra; every learner (one
multi-host JAX job per slice, --config.distributed=True) and the synchronizer run under
experiments.supervise, which restarts them when they exit abnormally, so a learner comes back and
rejoins from its checkpoint (diloco/launch/gcloud.py).

With --sweep, --config is a sweep file (get_sweep, diloco/studies/sweep.py): one launch per point,
in WORKDIR/<point name>, with the point's variants and overrides before the command line's and its
own slices (`<name_prefix>-p<index>`); a mode=dp point runs experiments.train on one slice.
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from diloco.launch import cli, gcloud, staging  # noqa: E402


def _define_flags() -> None:
  """Flags of the command line (defined here, not at import, so that tests can import this)."""
  config_flags.DEFINE_config_file("config", None, "Config file (get_config(arg)).")
  flags.DEFINE_bool("run", False, "Run the commands instead of printing them.")
  flags.DEFINE_bool("sweep", False, "--config is a sweep (get_sweep): one launch per point.")
  flags.DEFINE_string("workdir", gcloud.WORKDIR, "Outputs on each host.")
  flags.DEFINE_string("stage_dir", staging.Stage().dir, "Local directory for the pack and token.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  stage = staging.Stage(flags.FLAGS.stage_dir)
  spec, overrides = cli.config_spec(sys.argv[1:]), cli.config_overrides(sys.argv[1:])
  if flags.FLAGS.sweep:
    cmds = gcloud.sweep_commands(spec, overrides, flags.FLAGS.workdir, stage)
  else:
    cmds = gcloud.commands(spec, flags.FLAGS.config, overrides, flags.FLAGS.workdir, stage)
  try:
    cli.run_or_print(cmds, flags.FLAGS.run, stage)
  except ValueError as err:
    raise app.UsageError(str(err)) from err


if __name__ == "__main__":
  _define_flags()
  app.run(main)
