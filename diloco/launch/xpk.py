"""The xpk commands of a deployment on GKE: one workload per learner slice, one CPU workload for the
synchronizer, the token in a Kubernetes secret.

The token goes into the secret from the stage's mode-600 file (`kubectl create secret --from-file`,
never a literal) and every process reads it with --token_from=k8s:NAMESPACE/SECRET/token, so the
pod's service account is granted `get` on that one secret. xpk builds each workload's image from
deploy.xpk.base_image and the staged code (no .venv, runs or caches). JobSet restarts a workload
whose pod fails (`--max-restarts`, counting failures of our code too), and a learner resumes from
its checkpoint when WORKDIR outlives the pod (storage attached with `xpk storage attach`, or a
gs:// bucket mounted by GCS FUSE). Learners reach the synchronizer at its pod's JobSet DNS name,
`<workload>-slice-job-0-0.<workload>`, unless deploy.xpk.sync_address says otherwise. With
outer.sync_shards=S, each shard is its own CPU workload `<prefix>-sync<s>` (--shard=s), restarted
on its own, and learners are given every shard's address (sync_address: S of them, comma-separated).
"""

import shlex

from diloco.config import checks
from diloco.launch import gcloud, staging
from diloco.plan import tpu as tpu_types

XPK = ["xpk", "workload", "create"]
READER = "diloco-token-reader"


def check(config) -> list[str]:
  """ValueError naming the first bad setting; the learners' workload names."""
  checks.prepare(config)  # the whole config, before any workload exists
  d, x = config.deploy, config.deploy.xpk
  for key in ("project", "zone"):
    if not d.tpu[key]:
      raise ValueError(f"deploy.tpu.{key} is required")
  if not x.cluster:
    raise ValueError("deploy.xpk.cluster is required (the GKE cluster xpk created)")
  tpu_types.parse(d.tpu.accelerator_type)
  if not d.port:
    raise ValueError("deploy.port must be set: learners in other pods connect to it")
  sync_addresses(config)
  return gcloud.slice_names(config)


def sync_addresses(config) -> list[tuple[str, str]]:
  """(workload, address) of each synchronizer shard (one workload when unsharded)."""
  x, shards = config.deploy.xpk, config.outer.sync_shards
  sync = f"{config.deploy.tpu.name_prefix}-sync"
  names = [sync] if shards == 1 else [f"{sync}{s}" for s in range(shards)]
  given = [a.strip() for a in x.sync_address.split(",")] if x.sync_address else []
  if given and (len(given) != shards or not all(given)):
    raise ValueError(
        f"deploy.xpk.sync_address names {len(given)} addresses ({x.sync_address!r}) but "
        f"outer.sync_shards={shards}: one per shard, in shard order"
    )
  return [(n, given[s] if given else f"{n}-slice-job-0-0.{n}") for s, n in enumerate(names)]


def _apply(create: list[str]) -> list[str]:
  """`kubectl create ... --dry-run=client -o yaml | kubectl apply -f -`: create or update."""
  return ["bash", "-c", f"{shlex.join(create)} --dry-run=client -o yaml | kubectl apply -f -"]


def secret_commands(config, stage: staging.Stage) -> list[list[str]]:
  """The secret (from the token file), a role that may read only it, bound to the pods."""
  x = config.deploy.xpk
  ns = ["--namespace", x.namespace]
  return [
      _apply(
          ["kubectl", "create", "secret", "generic", x.token_secret, *ns]
          + [f"--from-file=token={stage.token}"]
      ),
      _apply(
          ["kubectl", "create", "role", READER, *ns, "--verb=get", "--resource=secrets"]
          + [f"--resource-name={x.token_secret}"]
      ),
      _apply(
          ["kubectl", "create", "rolebinding", READER, *ns, f"--role={READER}"]
          + [f"--serviceaccount={x.namespace}:default"]
      ),
  ]


def _workload(config, name: str, device: list[str], command: str, stage: staging.Stage) -> list:
  d, x = config.deploy, config.deploy.xpk
  return (
      XPK
      + [f"--workload={name}", f"--cluster={x.cluster}", *device]
      + [f"--base-docker-image={x.base_image}", f"--script-dir={stage.dir}/src"]
      + [f"--command={command}", f"--max-restarts={max(d.max_restarts, 0)}"]
      + ["--restart-on-user-code-failure", f"--priority={x.priority}"]
      + [f"--project={d.tpu.project}", f"--zone={d.tpu.zone}"]
  )


def commands(
    spec: str,
    config,
    overrides: tuple[str, ...] = (),
    workdir: str = "/data/diloco",
    stage: staging.Stage = staging.Stage(),
) -> list[list[str]]:
  """Every command of the deployment, in order, as argument lists (none holds the token)."""
  names = check(config)
  d, x, t = config.deploy, config.deploy.xpk, config.deploy.tpu
  syncs = sync_addresses(config)
  targets = ",".join(f"{address}:{d.port}" for _, address in syncs)
  flags_ = " ".join(shlex.quote(a) for a in (f"--config={spec}", *overrides))
  token = f"--token_from=k8s:{x.namespace}/{x.token_secret}/token"
  src = shlex.quote(f"{stage.dir}/src")
  cmds = [
      staging.pack(stage),
      ["bash", "-c", f"rm -rf {src} && mkdir -p {src} && tar -xzf {stage.code} -C {src}"],
      *secret_commands(config, stage),
  ]
  bind = " --config.deploy.bind=0.0.0.0" if d.bind == "127.0.0.1" else ""
  for s, (name, _) in enumerate(syncs):
    shard = f" --shard={s}" if len(syncs) > 1 else ""
    cmds.append(
        _workload(
            config,
            name,
            [f"--device-type={x.sync_device_type}", "--num-nodes=1"],
            f"pip install -q -e . && python -m experiments.synchronizer {flags_}{bind}{shard} "
            f"{token} --workdir={workdir}/{name.removeprefix(t.name_prefix + '-')}",
            stage,
        )
    )
  for m, name in enumerate(names):
    cmds.append(
        _workload(
            config,
            name,
            [f"--tpu-type={t.accelerator_type}", "--num-slices=1"],
            f"pip install -q -e '.[tpu]' && python -m experiments.learner {flags_} "
            f"--config.distributed=True --config.deploy.expect_platform=tpu --learner_id={m} "
            f"--synchronizer={targets} {token} --workdir={workdir}/learner{m}",
            stage,
        )
    )
  return cmds
