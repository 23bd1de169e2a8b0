"""The xpk workloads of a deployment on GKE (one per learner slice, one CPU workload for the
synchronizer), printed as a dry run or run with --run.

  python scripts/tpu/xpk.py --config=configs/shakespeare.py:mode=decoupled \
      --config.outer.learners=2 --config.deploy.port=50051 \
      --config.deploy.tpu.project=my-proj --config.deploy.tpu.zone=us-east5-a \
      --config.deploy.tpu.accelerator_type=v5p-16 --config.deploy.xpk.cluster=my-cluster \
      --workdir=/data/diloco [--run]

The cluster comes from `xpk cluster create`; WORKDIR must outlive a pod (attached storage) for a
restarted learner to resume from its checkpoint. Before anything is created, one learner is planned on
its slice as scripts/tpu/commands.py does (--noplan skips it). With --run the token is taken from $DILOCO_TOKEN,
written to the stage's mode-600 file and put into the Kubernetes secret deploy.xpk.token_secret
from that file; no command holds it (diloco/launch/xpk.py).
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from diloco.config import cli as config_cli  # noqa: E402
from diloco.launch import cli, preflight, xpk  # noqa: E402


def _define_flags() -> None:
  cli.define_launcher_flags("/data/diloco", "Outputs, on storage that outlives a pod.")


def main(argv):
  stage, spec, overrides = cli.launcher_args(argv)
  config = flags.FLAGS.config
  cmds = xpk.commands(spec, config, overrides, flags.FLAGS.workdir, stage)
  preflight.preflight(config, config.deploy.tpu.accelerator_type, flags.FLAGS.plan)
  cli.run_or_print(cmds, flags.FLAGS.run, stage)


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan compiles for a TPU; JAX runs nothing
  _define_flags()
  config_cli.run(main)
