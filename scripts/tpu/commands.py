"""Commands to run the gRPC runtime on Cloud TPU VMs: one learner per slice, one synchronizer.

  python scripts/tpu/commands.py --config=configs/shakespeare.py:mode=decoupled \
      --config.outer.learners=2 --config.deploy.port=50051 \
      --config.deploy.tpu.project=my-proj --config.deploy.tpu.zone=us-central2-b \
      --config.deploy.tpu.accelerator_type=v4-8 --config.deploy.tpu.sync_host=10.0.0.2 \
      [--config.deploy.tpu.sync_vm=diloco-sync] [--run]

Everything comes from the config's `deploy` section (diloco/config/deploy.py), overridden with
--config.KEY=VALUE flags; those overrides are passed on to the synchronizer and every learner.
Before anything is created, one learner is planned on its slice (diloco/launch/preflight.py:
experiments.plan's summary on stderr): a learner that does not fit its chips stops the launch with
exit code 2, naming the keys that lower its memory; --noplan skips the plan, saying so; without
libtpu the launch goes on after one line saying how to install it. Without --run it prints the
commands (a dry run; tests/test_cluster_launch.py checks them). With --run the
token is taken from $DILOCO_TOKEN and written to the stage's mode-600 file, which goes to each host
beside a pack of the code (diloco/launch/staging.py); it is never on a command line. Slices are
created if absent; each worker installs the package with the `tpu` extra; every learner (one
multi-host JAX job per slice, --config.distributed=True) and the synchronizer run under
experiments.supervise, which restarts them when they exit abnormally, so a learner comes back and
rejoins from its checkpoint (diloco/launch/gcloud.py).

With --sweep, --config is a sweep file (get_sweep, diloco/sweeps/sweep.py): one launch per point,
in WORKDIR/<point name>, with the point's variants and overrides before the command line's and its
own slices (`<name_prefix>-p<index>`); a mode=dp point runs experiments.train on one slice.
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from diloco.config import cli as config_cli  # noqa: E402
from diloco.launch import cli, gcloud, preflight  # noqa: E402


def _define_flags() -> None:
  cli.define_launcher_flags(
      gcloud.WORKDIR,
      "Outputs; a slice of several hosts needs a mount every worker shares (the default, each"
      " worker's $HOME, is refused there).",
  )
  flags.DEFINE_bool("sweep", False, "--config is a sweep (get_sweep): one launch per point.")


def main(argv):
  stage, spec, overrides = cli.launcher_args(argv)
  config = flags.FLAGS.config
  if flags.FLAGS.sweep:
    cmds = gcloud.sweep_commands(spec, overrides, flags.FLAGS.workdir, stage)
    print(
        "# plan: not run for --sweep; plan a point with python -m experiments.plan", file=sys.stderr
    )
  else:
    cmds = gcloud.commands(spec, config, overrides, flags.FLAGS.workdir, stage)
    preflight.preflight(config, config.deploy.tpu.accelerator_type, flags.FLAGS.plan)
  cli.run_or_print(cmds, flags.FLAGS.run, stage)


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan compiles for a TPU; JAX runs nothing
  _define_flags()
  config_cli.run(main)
