"""The xpk workloads of a deployment on GKE (one per learner slice, one CPU workload for the
synchronizer), printed as a dry run or run with --run.

  python scripts/tpu/xpk.py --config=configs/shakespeare.py:mode=decoupled \
      --config.outer.learners=2 --config.deploy.port=50051 \
      --config.deploy.tpu.project=my-proj --config.deploy.tpu.zone=us-east5-a \
      --config.deploy.tpu.accelerator_type=v5p-16 --config.deploy.xpk.cluster=my-cluster \
      --workdir=/data/diloco [--run]

The cluster comes from `xpk cluster create`; WORKDIR must outlive a pod (attached storage) for a
restarted learner to resume from its checkpoint. With --run the token is taken from $DILOCO_TOKEN,
written to the stage's mode-600 file and put into the Kubernetes secret deploy.xpk.token_secret
from that file; no command holds it (diloco/launch/xpk.py).
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from diloco.launch import cli, xpk  # noqa: E402


def _define_flags() -> None:
  cli.define_launcher_flags("/data/diloco", "Outputs, on storage that outlives a pod.")


def main(argv):
  stage, spec, overrides = cli.launcher_args(argv)
  cmds = xpk.commands(spec, flags.FLAGS.config, overrides, flags.FLAGS.workdir, stage)
  cli.run_or_print(cmds, flags.FLAGS.run, stage)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
