"""Commands to run the gRPC runtime on Cloud TPU VMs: one learner per slice, one synchronizer.

  python scripts/tpu/commands.py --config=configs/shakespeare.py:mode=decoupled \
      --config.outer.learners=2 --config.deploy.port=50051 \
      --config.deploy.tpu.project=my-proj --config.deploy.tpu.zone=us-central2-b \
      --config.deploy.tpu.accelerator_type=v4-8 --config.deploy.tpu.sync_host=10.0.0.2 [--run]

Everything comes from the config's `deploy` section (diloco/config/deploy.py), overridden with
--config.KEY=VALUE flags; those overrides are passed on to the synchronizer and every learner, so
all of them see the same config. Without --run it prints the commands (a dry run;
tests/test_launch.py checks them). The synchronizer starts first, on the machine that runs this
script, bound to deploy.tpu.sync_host (that machine's internal address) on deploy.port. Each slice
is created if absent (`describe || create`), gets a copy of this repository, installs it, and
starts its learner on every worker with `gcloud compute tpus tpu-vm ssh --worker=all` and
--config.distributed=True: the learner is one multi-host JAX job whose process 0 talks to the
synchronizer. The shared token is $DILOCO_TOKEN (printed as that name; --run sends its value).

With --sweep, --config is a sweep file (get_sweep, diloco/studies/sweep.py): one launch per point,
in WORKDIR/<point name>, with the point's variants and overrides before the command line's and its
own slices (`<name_prefix>-p<index>`); a mode=dp point runs experiments.train on one slice.
"""

import os
import shlex
import subprocess
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from diloco.config import deploy as deploy_lib

TOKEN = "$DILOCO_TOKEN"


def commands(
    spec: str,
    config,
    overrides: tuple[str, ...] = (),
    workdir: str = "$HOME/runs/diloco",
    token: str = TOKEN,
) -> list[list[str]]:
  """Every command of a deployment, in order, as argument lists.

  `spec` is the --config argument and `overrides` the --config.KEY=VALUE flags that made `config`.
  """
  d, t = config.deploy, config.deploy.tpu
  deploy_lib.check(d)
  learners = config.outer.learners
  if learners < 1:
    raise ValueError(f"need at least one learner, got outer.learners={learners}")
  if not t.project or not t.sync_host:
    raise ValueError("deploy.tpu.project and deploy.tpu.sync_host are required")
  if not d.port:
    raise ValueError("deploy.port must be set: learners on other hosts connect to it")
  g = ["gcloud", "compute", "tpus", "tpu-vm"]
  where = [f"--zone={t.zone}", f"--project={t.project}"]
  flags_ = " ".join(shlex.quote(a) for a in (f"--config={spec}", *overrides))
  # Loopback is unreachable from the slices: bind the internal address unless told otherwise.
  bind = f" --config.deploy.bind={shlex.quote(t.sync_host)}" if d.bind == "127.0.0.1" else ""
  sync = (
      f"nohup python -m experiments.synchronizer {flags_}{bind} --workdir={workdir}/sync "
      f"> sync.log 2>&1 &"
  )
  cmds = [["bash", "-c", sync]]
  for m in range(learners):
    name = f"{t.name_prefix}-learner{m}"
    learner = (
        f"cd {t.repo_dir} && pip install -e . && DILOCO_TOKEN={token} nohup python "
        f"-m experiments.learner {flags_} --config.distributed=True "
        f"--learner_id={m} --synchronizer={t.sync_host}:{d.port} "
        f"--workdir={workdir}/learner{m} > learner{m}.log 2>&1 &"
    )
    cmds += _slice(t, name) + [g + ["ssh", name, "--worker=all", f"--command={learner}"] + where]
  return cmds


def _slice(t, name: str) -> list[list[str]]:
  """Creates the slice `name` if absent and copies this repository to each of its workers."""
  g = ["gcloud", "compute", "tpus", "tpu-vm"]
  where = [f"--zone={t.zone}", f"--project={t.project}"]
  exists = " ".join(g + ["describe", name] + where)
  create = " ".join(
      g
      + [
          "create",
          name,
          f"--accelerator-type={t.accelerator_type}",
          f"--version={t.runtime_version}",
      ]
      + where
  )
  return [
      ["bash", "-c", f"{exists} >/dev/null 2>&1 || {create}"],
      g + ["scp", "--recurse", ".", f"{name}:{t.repo_dir}", "--worker=all"] + where,
  ]


def single_slice(spec: str, config, overrides: tuple[str, ...], workdir: str) -> list[list[str]]:
  """mode=dp on one slice: experiments.train as one multi-host JAX job (no synchronizer)."""
  t = config.deploy.tpu
  if not t.project:
    raise ValueError("deploy.tpu.project is required")
  name = f"{t.name_prefix}-dp"
  flags_ = " ".join(shlex.quote(a) for a in (f"--config={spec}", *overrides))
  train = (
      f"cd {t.repo_dir} && pip install -e . && nohup python -m experiments.train {flags_} "
      f"--config.distributed=True --workdir={workdir} > train.log 2>&1 &"
  )
  where = [f"--zone={t.zone}", f"--project={t.project}"]
  ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name, "--worker=all", f"--command={train}"]
  return _slice(t, name) + [ssh + where]


def sweep_commands(
    spec: str, overrides: tuple[str, ...], workdir: str, token: str = TOKEN
) -> list[list[str]]:
  """One launch per point of the sweep `spec` (diloco/studies/sweep.py), in DIR/<point name>.

  `overrides` (the command line's --config.KEY=VALUE, e.g. the deploy section) apply to every
  point after its own; each point gets its own slices (name prefix `<prefix>-p<index>`).
  """
  from diloco.studies import sweep  # pylint: disable=import-outside-toplevel

  cmds = []
  for p in sweep.points(spec):
    config = p.config.copy_and_resolve_references()
    for flag in overrides:
      key, _, raw = flag[len("--config.") :].partition("=")
      sweep.set_from_text(config, key, raw)
    prefix = f"{config.deploy.tpu.name_prefix}-p{p.index}"
    config.deploy.tpu.name_prefix = prefix
    flags_ = (*p.flags(), *overrides, f"--config.deploy.tpu.name_prefix={prefix}")
    where = f"{workdir}/{p.name}"
    cmds.append(["echo", f"# point {p.index}: {p.name}"])
    if config.mode == "dp":
      cmds += single_slice(p.spec, config, flags_, where)
    else:
      cmds += commands(p.spec, config, flags_, where, token)
  return cmds


def config_spec(argv: list[str]) -> str:
  """The value of --config (file[:args]) on a command line."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  raise ValueError("--config is required")


def config_overrides(argv: list[str]) -> tuple[str, ...]:
  """The --config.KEY=VALUE flags of a command line (a value in the next argument is joined)."""
  out, i = [], 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config."):
      if "=" not in a and i + 1 < len(argv):
        a, i = f"{a}={argv[i + 1]}", i + 1
      out.append(a)
    i += 1
  return tuple(out)


def _define_flags() -> None:
  """Flags of the command line (defined here, not at import, so that tests can import this)."""
  config_flags.DEFINE_config_file("config", None, "Config file (get_config(arg)).")
  flags.DEFINE_bool("run", False, "Run the commands instead of printing them.")
  flags.DEFINE_bool("sweep", False, "--config is a sweep (get_sweep): one launch per point.")
  flags.DEFINE_string("workdir", "$HOME/runs/diloco", "Outputs on each host.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  run = flags.FLAGS.run
  token = TOKEN
  if run:
    token = os.environ.get("DILOCO_TOKEN", "")
    if not token:
      raise app.UsageError("set DILOCO_TOKEN to the shared secret before --run")
  spec, overrides = config_spec(sys.argv[1:]), config_overrides(sys.argv[1:])
  if flags.FLAGS.sweep:
    cmds = sweep_commands(spec, overrides, flags.FLAGS.workdir, token)
  else:
    cmds = commands(spec, flags.FLAGS.config, overrides, flags.FLAGS.workdir, token)
  for cmd in cmds:
    if run:
      print(shlex.join(cmd).replace(token, TOKEN), flush=True)
      subprocess.run(cmd, check=True)
    else:
      print(shlex.join(cmd), flush=True)
  if not run:
    print("# dry run: nothing was executed (add --run)", file=sys.stderr)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
