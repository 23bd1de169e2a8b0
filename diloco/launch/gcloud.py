"""The gcloud commands of a deployment on Cloud TPU VMs: one learner per slice, one synchronizer.

Every command is an argument list; none holds the token (the launcher writes it to the stage's
mode-600 file, which is copied beside the code). The code goes out as a pack of what a learner
needs (diloco/launch/staging.py); TPU workers install the `tpu` extra and learners start with
deploy.expect_platform=tpu, so a worker whose JAX cannot see its chips stops with an error
instead of training on the host's CPU. Each process runs under experiments.supervise. The
synchronizer runs on the launching machine, or on the CPU VM deploy.tpu.sync_vm (created with
the internal address deploy.tpu.sync_host). With outer.sync_shards=S, shard s runs as its own
supervised process (--shard=s, WORKDIR/sync<s>): sync_host and sync_vm may list S addresses and
VMs (one shard per CPU host, each on deploy.port), or name one (every shard there, on deploy.port
+ s); learners are given every shard's address.
"""

import shlex

from diloco import paths
from diloco.config import checks
from diloco.launch import staging
from diloco.plan import tpu as tpu_types

TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
VM = ["gcloud", "compute"]
WORKDIR = "$HOME/runs/diloco"
LOGS = "$HOME/runs/diloco-logs"  # a bucket workdir's process logs, on each machine's own disk


def slice_names(config) -> list[str]:
  """One slice per learner: deploy.tpu.slices if given (checked against outer.learners)."""
  t, learners = config.deploy.tpu, config.outer.learners
  if not t.slices:
    return [f"{t.name_prefix}-learner{m}" for m in range(learners)]
  names = [n.strip() for n in t.slices.split(",")]
  if len(names) != learners or not all(names):
    raise ValueError(
        f"deploy.tpu.slices names {len(names)} slices ({t.slices!r}) but outer.learners="
        f"{learners}: one slice per learner"
    )
  return names


def check(config, *, synchronizer: bool = True) -> list[str]:
  """ValueError naming the first bad setting, before anything is created; the slice names."""
  checks.prepare(config)  # the whole config, before any VM or slice exists
  d, t = config.deploy, config.deploy.tpu
  for key in ("project", "zone"):
    if not t[key]:
      raise ValueError(f"deploy.tpu.{key} is required")
  tpu_types.parse(t.accelerator_type)
  if config.outer.learners < 1:
    raise ValueError(f"need at least one learner, got outer.learners={config.outer.learners}")
  names = slice_names(config)
  if synchronizer:
    if not t.sync_host:
      raise ValueError("deploy.tpu.sync_host is required: the synchronizer's internal address")
    if not d.port:
      raise ValueError("deploy.port must be set: learners on other hosts connect to it")
    sync_places(config)
  return names


def check_workdir(workdir: str, config) -> None:
  """ValueError when the slices have several hosts and `workdir` is each worker's own disk
  (under $HOME or ~, relative, or /tmp): a multi-host learner's processes checkpoint one state
  together, so they need one directory that every worker sees (a bucket, or a shared mount)."""
  hosts = tpu_types.parse(config.deploy.tpu.accelerator_type).hosts
  local = not paths.is_url(workdir) and (
      workdir.startswith(("$HOME", "~", "/tmp")) or not workdir.startswith("/")
  )
  if hosts > 1 and local:
    raise ValueError(
        f"--workdir={workdir} is each worker's own disk, and deploy.tpu.accelerator_type="
        f"{config.deploy.tpu.accelerator_type} has {hosts} hosts per slice: a learner's "
        "processes save one checkpoint together, so give --workdir=gs://BUCKET/PATH (a VM's "
        "disk goes with it) or a mount every worker shares (Filestore)"
    )


def log_dir(workdir: str) -> str:
  """Where a process's output and its supervisor's log go: its workdir, or under LOGS on the
  machine's own disk when the workdir is a bucket (a shell appends to a file, not to an object,
  and every worker of a slice writes its own)."""
  if not paths.is_url(workdir):
    return workdir
  return f"{LOGS}/{workdir.split('://', 1)[1]}"


def sync_places(config) -> list[tuple[str, str, int]]:
  """(VM or '' for this machine, internal address, port) of each synchronizer shard."""
  d, t, shards = config.deploy, config.deploy.tpu, config.outer.sync_shards
  hosts = [h.strip() for h in t.sync_host.split(",")]
  vms = [v.strip() for v in t.sync_vm.split(",")] if t.sync_vm else [""] * len(hosts)
  if len(hosts) not in (1, shards) or not all(hosts):
    raise ValueError(
        f"deploy.tpu.sync_host names {len(hosts)} addresses ({t.sync_host!r}) for "
        f"outer.sync_shards={shards}: give one (every shard there) or one per shard"
    )
  if len(vms) != len(hosts) or (t.sync_vm and not all(vms)):
    raise ValueError(
        f"deploy.tpu.sync_vm names {len(vms)} VMs ({t.sync_vm!r}) for {len(hosts)} sync_host "
        "address(es): one VM per address"
    )
  if len(hosts) == 1:
    return [(vms[0], hosts[0], d.port + s) for s in range(shards)]
  return [(vm, host, d.port) for vm, host in zip(vms, hosts)]


def _where(t) -> list[str]:
  return [f"--zone={t.zone}", f"--project={t.project}"]


def _flags(spec: str, overrides: tuple[str, ...]) -> str:
  return " ".join(shlex.quote(a) for a in (f"--config={spec}", *overrides))


def _slice(t, name: str, stage: staging.Stage) -> list[list[str]]:
  """Creates the slice `name` if absent; copies the pack and the token file to its workers."""
  exists = shlex.join(TPU + ["describe", name] + _where(t))
  create = shlex.join(
      TPU
      + ["create", name, f"--accelerator-type={t.accelerator_type}"]
      + [f"--version={t.runtime_version}"]
      + _where(t)
  )
  return [
      ["bash", "-c", f"{exists} >/dev/null 2>&1 || {create}"],
      TPU + ["scp", stage.code, stage.token, f"{name}:~", "--worker=all"] + _where(t),
  ]


def _sync(config, flags_: str, workdir: str, stage: staging.Stage) -> list[list[str]]:
  """Each synchronizer shard under its supervisor, on its VM or on this machine (a VM is
  created and given the code once, however many shards it runs)."""
  d, t, shards = config.deploy, config.deploy.tpu, config.outer.sync_shards
  cmds, ready = [], set()
  for s, (vm, host, port) in enumerate(sync_places(config)):
    name = "sync" if shards == 1 else f"sync{s}"
    # Loopback is unreachable from the slices: bind the internal address unless told otherwise.
    bind = f" --config.deploy.bind={shlex.quote(host)}" if d.bind == "127.0.0.1" else ""
    shard = "" if shards == 1 else f" --shard={s} --config.deploy.port={port}"
    logs = log_dir(workdir)
    log = f"{logs}/{name}.supervisor.jsonl"
    command = f"experiments.synchronizer {flags_}{bind}{shard}"
    if not vm:
      command += f" --workdir={workdir}/{name}"
      line = staging.supervised(command, d, log, f"{logs}/{name}.log", python="python")
      cmds.append(["bash", "-c", f"mkdir -p {logs} && " + line])
      continue
    if vm not in ready:
      cmds += _sync_vm(t, vm, host, stage)
      ready.add(vm)
    command += f" {staging.token_flag(t.repo_dir)} --workdir={workdir}/{name}"
    remote = f"{staging.unpack(t.repo_dir)}; mkdir -p {logs}; " + staging.supervised(
        command, d, log, f"{logs}/{name}.log"
    )
    cmds.append(VM + ["ssh", vm] + _where(t) + [f"--command={remote}"])
  return cmds


def _sync_vm(t, vm: str, host: str, stage: staging.Stage) -> list[list[str]]:
  """Creates CPU VM `vm` at internal address `host` unless it exists; copies the code there."""
  exists = shlex.join(VM + ["instances", "describe", vm] + _where(t))
  create = shlex.join(
      VM
      + ["instances", "create", vm, f"--machine-type={t.sync_machine_type}"]
      + ["--image-family=debian-12", "--image-project=debian-cloud"]
      + [f"--private-network-ip={host}"]
      + _where(t)
  )
  return [
      ["bash", "-c", f"{exists} >/dev/null 2>&1 || {create}"],
      VM + ["scp", stage.code, stage.token, f"{vm}:~"] + _where(t),
  ]


def _on_workers(t, name: str, command: str, workdir: str, deploy, log_name: str) -> list[str]:
  """ssh to every worker of slice `name`: unpack, install with the tpu extra, start `command`."""
  logs = log_dir(workdir)
  remote = f"{staging.unpack(t.repo_dir, 'tpu')}; mkdir -p {logs}; " + staging.supervised(
      command, deploy, f"{logs}/supervisor.jsonl", f"{logs}/{log_name}.log"
  )
  return TPU + ["ssh", name, "--worker=all", f"--command={remote}"] + _where(t)


def commands(
    spec: str,
    config,
    overrides: tuple[str, ...] = (),
    workdir: str = WORKDIR,
    stage: staging.Stage = staging.Stage(),
    pack: bool = True,
) -> list[list[str]]:
  """Every command of a deployment, in order, as argument lists.

  `spec` is the --config argument and `overrides` the --config.KEY=VALUE flags that made `config`;
  every process gets both, so all of them see the same config.
  """
  names = check(config)
  check_workdir(workdir, config)
  d, t = config.deploy, config.deploy.tpu
  flags_ = _flags(spec, overrides)
  cmds = [staging.pack(stage)] if pack else []
  cmds += _sync(config, flags_, workdir, stage)
  targets = ",".join(f"{host}:{port}" for _, host, port in sync_places(config))
  for m, name in enumerate(names):
    learner = (
        f"experiments.learner {flags_} --config.distributed=True "
        f"--config.deploy.expect_platform=tpu --learner_id={m} "
        f"--synchronizer={targets} {staging.token_flag(t.repo_dir)} "
        f"--workdir={workdir}/learner{m}"
    )
    cmds += _slice(t, name, stage)
    cmds.append(_on_workers(t, name, learner, f"{workdir}/learner{m}", d, "learner"))
  return cmds


def single_slice(
    spec: str,
    config,
    overrides: tuple[str, ...],
    workdir: str,
    stage: staging.Stage = staging.Stage(),
    pack: bool = True,
) -> list[list[str]]:
  """mode=dp on one slice: experiments.train as one multi-host JAX job (no synchronizer)."""
  check(config, synchronizer=False)
  check_workdir(workdir, config)
  t = config.deploy.tpu
  name = f"{t.name_prefix}-dp"
  train = (
      f"experiments.train {_flags(spec, overrides)} --config.distributed=True "
      f"--config.deploy.expect_platform=tpu --workdir={workdir}"
  )
  cmds = [staging.pack(stage)] if pack else []
  return (
      cmds + _slice(t, name, stage) + [_on_workers(t, name, train, workdir, config.deploy, "train")]
  )


def sweep_commands(
    spec: str, overrides: tuple[str, ...], workdir: str, stage: staging.Stage = staging.Stage()
) -> list[list[str]]:
  """One launch per point of the sweep `spec` (diloco/sweeps/sweep.py), in DIR/<point name>.

  `overrides` (the command line's --config.KEY=VALUE, e.g. the deploy section) apply to every
  point after its own; each point gets its own slices (name prefix `<prefix>-p<index>`).
  """
  from diloco.sweeps import sweep  # pylint: disable=import-outside-toplevel

  cmds = [staging.pack(stage)]
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
      cmds += single_slice(p.spec, config, flags_, where, stage, pack=False)
    else:
      cmds += commands(p.spec, config, flags_, where, stage, pack=False)
  return cmds
