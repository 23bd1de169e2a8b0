"""Commands to run the gRPC runtime on Cloud TPU VMs: one learner per slice, one synchronizer.

  python scripts/tpu/commands.py --config=configs/shakespeare.py:mode=decoupled \
      --project=my-proj --zone=us-central2-b --accelerator_type=v4-8 --sync_host=10.0.0.2 \
      [--run]

Without --run it prints the commands (a dry run; tests/test_launch.py checks them). Each slice is
created if absent (`describe || create`), gets a copy of this repository, installs it, and starts
its learner on every worker with `gcloud compute tpus tpu-vm ssh --worker=all`; the learner's
multi-host JAX job then talks to the synchronizer from process 0 only. The synchronizer starts
first, on the machine that runs this script, bound to --sync_host (that machine's internal
address); the shared token is $DILOCO_TOKEN on every host.
"""

import argparse
import shlex
import subprocess
import sys


def commands(config: str, learners: int, project: str, zone: str, accelerator_type: str,
             runtime_version: str, sync_host: str, port: int = 50051, prefix: str = "diloco",
             repo_dir: str = "~/diloco", workdir: str = "~/runs/diloco") -> list[list[str]]:
    """Every command of a deployment, in order, as argument lists."""
    if learners < 1:
        raise ValueError(f"need at least one learner, got {learners}")
    if not project or not sync_host:
        raise ValueError("--project and --sync_host are required")
    g = ["gcloud", "compute", "tpus", "tpu-vm"]
    where = [f"--zone={zone}", f"--project={project}"]
    cfg = shlex.quote(config)
    cmds = []
    for m in range(learners):
        name = f"{prefix}-learner{m}"
        exists = " ".join(g + ["describe", name] + where)
        create = " ".join(g + ["create", name, f"--accelerator-type={accelerator_type}",
                               f"--version={runtime_version}"] + where)
        cmds.append(["bash", "-c", f"{exists} >/dev/null 2>&1 || {create}"])
        cmds.append(g + ["scp", "--recurse", ".", f"{name}:{repo_dir}", "--worker=all"] + where)
        learner = (f"cd {repo_dir} && pip install -e . && DILOCO_TOKEN=$DILOCO_TOKEN nohup python "
                   f"-m experiments.learner --config={cfg} --config.distributed=True "
                   f"--learner_id={m} --synchronizer={sync_host}:{port} "
                   f"--workdir={workdir}/learner{m} > learner{m}.log 2>&1 &")
        cmds.append(g + ["ssh", name, "--worker=all", f"--command={learner}"] + where)
    sync = (f"DILOCO_TOKEN=$DILOCO_TOKEN python -m experiments.synchronizer --config={cfg} "
            f"--port={port} --bind={sync_host} --workdir={workdir}/sync")
    cmds.insert(0, ["bash", "-c", f"nohup {sync} > sync.log 2>&1 &"])
    return cmds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--project", default="")
    ap.add_argument("--zone", default="us-central2-b")
    ap.add_argument("--accelerator_type", default="v4-8")
    ap.add_argument("--runtime_version", default="tpu-ubuntu2204-base")
    ap.add_argument("--sync_host", default="")
    ap.add_argument("--port", type=int, default=50051)
    ap.add_argument("--run", action="store_true", help="run the commands instead of printing")
    args = ap.parse_args()
    cmds = commands(args.config, args.learners, args.project, args.zone, args.accelerator_type,
                    args.runtime_version, args.sync_host, args.port)
    for cmd in cmds:
        print(shlex.join(cmd), flush=True)
        if args.run:
            subprocess.run(cmd, check=True)
    if not args.run:
        print("# dry run: nothing was executed (add --run)", file=sys.stderr)


if __name__ == "__main__":
    main()
