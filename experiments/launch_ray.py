"""The synchronizer and M learners on a Ray cluster, restarted when they fail:

  python -m experiments.launch_ray --config=configs/shakespeare.py:mode=decoupled,learners=4 \
      --learners=4 --workdir=/shared/runs/d [--address=HEAD:6379] [--tpu] [--config.KEY=VALUE...]

Without --address a local Ray is started on this machine (and stopped at the end). --tpu puts each
learner on a TPU slice of its own (deploy.tpu.accelerator_type and deploy.tpu.topology; one task
per host, --config.distributed=True) through Ray's TPU resources; the synchronizer runs on the
node started with `--resources='{"diloco_sync": 1}'` if there is one (a CPU node). A task that
fails is submitted again after a backoff, up to deploy.max_restarts times
(diloco/launch/ray_launch.py): learners resume from their checkpoints, the synchronizer restores
its own. WORKDIR must be the same path on every node (shared storage) for a restart on another
node to find its checkpoint. With --tpu, one learner is planned on its slice before Ray starts
(diloco/launch/preflight.py; --noplan skips it): one that does not fit stops the launch, exit 2.
The token comes from --token_from (default env:DILOCO_TOKEN; a random one when unset) and reaches
the tasks as an argument, never a command line. Expected: the
run ends with WORKDIR/ray_report.json (restarts per role, the synchronizer's and each learner's
summary) and exit 0.
"""

import os
import secrets
import sys

from absl import app, flags
from ml_collections import config_flags

from diloco import paths
from diloco.config import cli as config_cli
from diloco.launch import cli, preflight, ray_launch, staging, tokens
from diloco.rpc import local

_CONFIG = config_flags.DEFINE_config_file("config", None, config_cli.HELP)
_LEARNERS = flags.DEFINE_integer("learners", None, "Learners M (must equal outer.learners).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Outputs, on storage every node shares.")
_ADDRESS = flags.DEFINE_string("address", "", "An existing Ray cluster (empty: start one here).")
_TPU = flags.DEFINE_bool("tpu", False, "Each learner on a TPU slice of its own.")
_SHIP = flags.DEFINE_bool("ship_code", False, "Send this checkout to the workers (working_dir).")
_TOKEN = cli.define_token_flag()
_MAX_S = flags.DEFINE_float("max_s", 24 * 3600.0, "Give up (and cancel everything) after this.")
cli.define_plan_flag()
flags.mark_flags_as_required(["config", "learners", "workdir"])


def _token() -> str:
  try:
    return tokens.read(_TOKEN.value)
  except ValueError:
    if _TOKEN.value != cli.DEFAULT_TOKEN:
      raise
    return secrets.token_hex(16)  # nothing set: this run's own


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    import ray  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise app.UsageError("Ray is not installed: pip install -e '.[ray]'") from err
  try:
    workdir = paths.local_only(_WORKDIR.value, "the Ray launcher")
  except ValueError as err:
    raise app.UsageError(str(err)) from None
  spec, overrides = cli.config_spec(sys.argv[1:]), cli.config_overrides(sys.argv[1:])
  p = ray_launch.plan(_CONFIG.value, _LEARNERS.value, _TPU.value)
  if _TPU.value:  # before Ray starts: a learner that does not fit its slice stops here (exit 2)
    preflight.preflight(_CONFIG.value, _CONFIG.value.deploy.tpu.accelerator_type, flags.FLAGS.plan)
  env = None
  if _SHIP.value:
    env = {"working_dir": staging.REPO, "excludes": list(staging.EXCLUDED) + ["notebooks", "tests"]}
  else:
    path, _, arg = spec.partition(":")
    spec = os.path.abspath(path if os.path.exists(path) else os.path.join(local.REPO, path))
    spec += f":{arg}" if arg else ""
  ray.init(address=_ADDRESS.value or None, include_dashboard=False, log_to_driver=False)
  try:
    driver = ray_launch.Driver(spec, overrides, workdir, _token(), p, env)
    report = driver.run(_MAX_S.value)
  finally:
    ray.shutdown()
  print(f"ray: finished in {report['wall_s']} s, restarts {report['restarts']}", flush=True)


if __name__ == "__main__":
  config_cli.run(main)
