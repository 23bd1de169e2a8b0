"""The cluster launchers: Cloud TPU VMs through gcloud, GKE through xpk, Ray's plan; accelerator
types; token references; the supervisor's restart loop. (The live Ray run: tests/test_ray.py.)"""

import base64
import http.server
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time

import pytest

from configs import shakespeare
from diloco.launch import cli, gcloud, ray_launch, staging, supervisor, tokens, xpk
from diloco.plan import tpu as tpu_types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "s3cr3t-t0ken-value"
TPU_FLAGS = (
    "--config.outer.learners=2",
    "--config.deploy.port=6000",
    "--config.deploy.tpu.project=proj",
    "--config.deploy.tpu.zone=z1",
    "--config.deploy.tpu.accelerator_type=v5p-16",
    "--config.deploy.tpu.sync_host=10.0.0.2",
)


def _config(*flags: str, variants: str = "mode=decoupled"):
  c = shakespeare.get_config(variants)
  from diloco.sweeps import sweep  # pylint: disable=import-outside-toplevel

  for flag in flags:
    key, _, raw = flag[len("--config.") :].partition("=")
    sweep.set_from_text(c, key, raw)
  return c


def _remote(cmd: list[str]) -> str:
  """The --command= of an ssh or xpk command."""
  return next(a.split("=", 1)[1] for a in cmd if a.startswith("--command="))


# ---- accelerator types ----


def test_accelerator_types_count_chips_and_hosts():
  # v5p-16: 16 TensorCores = 8 chips = 2 hosts of 4; v4-8: one host; v5litepod-16: 16 chips, 4
  # hosts of 4; v6e-8: one host of 8.
  for name, chips, hosts in [("v5p-16", 8, 2), ("v4-8", 4, 1), ("v5litepod-16", 16, 4)]:
    pod = tpu_types.parse(name)
    assert (pod.chips, pod.hosts, pod.chips_per_host) == (chips, hosts, 4), name
  assert tpu_types.parse("v6e-8").chips_per_host == 8
  for bad in ("v5p", "tpu-v4-8", "v9-8", "v4-12", "v5litepod-6", ""):
    with pytest.raises(ValueError, match="deploy.tpu.accelerator_type"):
      tpu_types.parse(bad)
  assert tpu_types.check_topology(tpu_types.parse("v5p-16"), "2x2x2") == "2x2x2"
  with pytest.raises(ValueError, match="2x2x1 has 4 chips but .*v5p-16 has 8"):
    tpu_types.check_topology(tpu_types.parse("v5p-16"), "2x2x1")


# ---- token references ----


def test_token_from_file_env_and_refusals(tmp_path, monkeypatch):
  path = tokens.write(str(tmp_path / "t"), SECRET + "\n")
  assert os.stat(path).st_mode & 0o777 == 0o600
  assert tokens.read(f"file:{path}") == SECRET
  os.chmod(path, 0o644)
  with pytest.raises(ValueError, match="mode 644: others can read it"):
    tokens.read(f"file:{path}")
  monkeypatch.setenv("T_TEST", SECRET)
  assert tokens.read("env:T_TEST") == SECRET
  with pytest.raises(ValueError, match="empty token"):
    tokens.read("env:T_UNSET_ANYWHERE")
  with pytest.raises(ValueError, match="expected env:NAME, file:PATH or k8s"):
    tokens.read(SECRET)


class _SecretApi(http.server.BaseHTTPRequestHandler):
  """The Kubernetes API's GET of one secret, for a bearer it knows."""

  def do_GET(self):  # pylint: disable=invalid-name
    ok = self.headers.get("Authorization") == "Bearer sa-token"
    if not ok or self.path != "/api/v1/namespaces/ns1/secrets/diloco-token":
      self.send_response(403)
      self.end_headers()
      return
    body = json.dumps({"data": {"token": base64.b64encode(SECRET.encode()).decode()}}).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


def test_token_from_a_kubernetes_secret(tmp_path):
  (tmp_path / "token").write_text("sa-token\n")
  server = http.server.HTTPServer(("127.0.0.1", 0), _SecretApi)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  api = f"http://127.0.0.1:{server.server_port}"
  try:
    read = lambda ref: tokens.read(ref, api=api, account_dir=str(tmp_path))
    assert read("k8s:ns1/diloco-token/token") == SECRET
    with pytest.raises(ValueError, match="has no key 'other'"):
      read("k8s:ns1/diloco-token/other")
    with pytest.raises(ValueError, match="expected NAMESPACE/SECRET/KEY"):
      read("k8s:ns1/diloco-token")
  finally:
    server.shutdown()


# ---- the supervisor ----


def _flaky(tmp_path, failures: int, rc: int = 3) -> list[str]:
  """A command that exits `rc` its first `failures` runs, then 0 (counting in a file)."""
  counter = tmp_path / "runs"
  code = (
      f"import pathlib,sys; p=pathlib.Path({str(counter)!r}); n=int(p.read_text() or 0) "
      f"if p.exists() else 0; p.write_text(str(n+1)); sys.exit({rc} if n < {failures} else 0)"
  )
  return [sys.executable, "-c", code]


def test_supervisor_restarts_abnormal_exits_with_doubling_backoff(tmp_path):
  log = str(tmp_path / "sup.jsonl")
  sup = supervisor.Supervisor(_flaky(tmp_path, 3), supervisor.Policy(10, 0.05, 0.15), log)
  t0 = time.monotonic()
  assert sup.run() == 0 and sup.restarts == 3
  # Delays 0.05, 0.10, then 0.15 (doubling, capped): at least 0.30 s in all.
  assert time.monotonic() - t0 >= 0.30
  events = [json.loads(line)["event"] for line in open(log)]
  assert events == ["start", "exit"] * 4
  rcs = [json.loads(line).get("rc") for line in open(log) if '"exit"' in line]
  assert rcs == [3, 3, 3, 0]


def test_supervisor_gives_up_and_restarts_a_killed_child(tmp_path):
  sup = supervisor.Supervisor(_flaky(tmp_path, 10, rc=75), supervisor.Policy(2, 0.0, 0.0))
  assert sup.run() == 75 and sup.restarts == 2  # 3 runs, then the exit code of the last
  pid_file = tmp_path / "pids"
  code = f"import os,time; open({str(pid_file)!r},'a').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
  sup = supervisor.Supervisor([sys.executable, "-c", code], supervisor.Policy(1, 0.0, 0.0))
  done = []
  th = threading.Thread(target=lambda: done.append(sup.run()))
  th.start()
  for i in range(2):  # SIGKILL the child twice: restarted once, then given up
    while not pid_file.exists() or len(pid_file.read_text().split()) < i + 1:
      time.sleep(0.05)
    os.kill(int(pid_file.read_text().split()[-1]), signal.SIGKILL)
  th.join(10)
  assert done == [-signal.SIGKILL] and sup.restarts == 1
  with pytest.raises(ValueError, match="backoff_s <= max_backoff_s"):
    supervisor.Policy(1, 5.0, 1.0)


def test_supervise_passes_sigterm_on_and_does_not_restart(tmp_path):
  marker = tmp_path / "term"
  code = (
      "import signal,sys,time,pathlib; signal.signal(signal.SIGTERM, lambda *a: "
      f"(pathlib.Path({str(marker)!r}).write_text('x'), sys.exit(143))); time.sleep(60)"
  )
  log = tmp_path / "sup.jsonl"
  proc = subprocess.Popen(
      [sys.executable, "-m", "experiments.supervise", f"--log={log}", "--backoff_s=0", "--"]
      + [sys.executable, "-c", code],
      cwd=REPO,
  )
  while not log.exists():
    time.sleep(0.05)
  time.sleep(0.5)  # the child installs its handler
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(30) == 143 and marker.read_text() == "x"
  assert [json.loads(line)["event"] for line in open(log)] == ["start", "exit"]


# ---- gcloud ----


def test_gcloud_commands_install_tpu_jax_supervise_and_never_hold_the_token(tmp_path):
  spec = "configs/shakespeare.py:mode=decoupled"
  c = _config(*TPU_FLAGS, "--config.deploy.tpu.sync_vm=dsync")
  stage = staging.Stage(str(tmp_path / "stage"))
  cmds = gcloud.commands(spec, c, TPU_FLAGS + ("--config.deploy.tpu.sync_vm=dsync",), "/w", stage)
  assert all(SECRET not in a for cmd in cmds for a in cmd)
  # pack; sync VM create, copy, start; per learner slice: create, copy, start.
  assert len(cmds) == 1 + 3 + 3 * 2
  vm_create, vm_copy, vm_start = cmds[1:4]
  assert "instances create dsync --machine-type=n2-standard-8" in vm_create[2]
  assert "--private-network-ip=10.0.0.2" in vm_create[2]
  assert vm_copy[:3] == ["gcloud", "compute", "scp"] and stage.token in vm_copy
  sync = _remote(vm_start)
  assert ".venv/bin/pip install -q -e .;" in sync and "[tpu]" not in sync
  for m, (create, copy, start) in enumerate([cmds[4:7], cmds[7:10]]):
    name = f"diloco-learner{m}"
    assert f"create {name} --accelerator-type=v5p-16" in create[2]
    assert copy[4:8] == ["scp", stage.code, stage.token, f"{name}:~"] and "--recurse" not in copy
    assert start[4:7] == ["ssh", name, "--worker=all"]
    remote = _remote(start)
    assert ".venv/bin/pip install -q -e '.[tpu]'" in remote
    assert "chmod 600 ~/diloco/.diloco_token" in remote and "umask 077" in remote
    words = shlex.split(remote.rsplit("setsid nohup ", 1)[1].split(" >> ")[0])
    # The learner runs under the supervisor, with every override and its own flags.
    assert words[:4] == [".venv/bin/python", "-m", "experiments.supervise", "--max_restarts=20"]
    child = words[words.index("--") + 1 :]
    assert child[:3] == [".venv/bin/python", "-m", "experiments.learner"]
    for flag in (f"--config={spec}", *TPU_FLAGS, "--config.distributed=True", f"--learner_id={m}"):
      assert flag in child, flag
    assert "--config.deploy.expect_platform=tpu" in child
    assert "--token_from=file:~/diloco/.diloco_token" in child
    assert "--synchronizer=10.0.0.2:6000" in child and not any("DILOCO_TOKEN" in w for w in child)


def test_a_bucket_workdir_is_shared_by_a_slice_and_logs_stay_on_each_machine(tmp_path):
  c = _config(*TPU_FLAGS)  # v5p-16: two hosts per slice
  stage = staging.Stage(str(tmp_path / "stage"))
  cmds = gcloud.commands("configs/shakespeare.py", c, TPU_FLAGS, "gs://b/run", stage, pack=False)
  sync, learner0 = cmds[0][2], _remote(cmds[3])
  assert "--workdir=gs://b/run/sync " in sync and "mkdir -p $HOME/runs/diloco-logs/b/run &&" in sync
  assert "--log=$HOME/runs/diloco-logs/b/run/sync.supervisor.jsonl" in sync
  assert "--workdir=gs://b/run/learner0 " in learner0
  assert "mkdir -p $HOME/runs/diloco-logs/b/run/learner0;" in learner0
  assert learner0.endswith(
      ">> $HOME/runs/diloco-logs/b/run/learner0/learner.log 2>&1 < /dev/null &"
  )
  assert not any("mkdir -p gs:" in a or ">> gs:" in a for cmd in cmds for a in cmd)
  with pytest.raises(ValueError, match=r"--workdir=runs/x is each worker's own disk.*gs://BUCKET"):
    gcloud.commands("configs/shakespeare.py", c, TPU_FLAGS, "runs/x", stage, pack=False)


def test_the_pack_holds_only_what_a_learner_needs(tmp_path):
  stage = staging.Stage(str(tmp_path / "stage"))
  repo = tmp_path / "repo"
  tree = [
      ("setup.py",),
      ("pyproject.toml",),
      ("diloco", "a.py"),
      ("diloco", "__pycache__", "a.pyc"),
  ]
  tree += [("configs", "c.py"), ("experiments", "e.py"), ("runs", "x", "y"), (".venv", "bin", "py")]
  tree += [("notebooks", "n.ipynb")]
  for rel in (os.path.join(*parts) for parts in tree):
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_text("x")
  subprocess.run(staging.pack(stage, str(repo)), check=True)
  assert os.stat(stage.code).st_mode & 0o077 == 0
  with tarfile.open(stage.code) as tar:
    files = sorted(m.name for m in tar.getmembers() if m.isfile())
  assert files == sorted(os.path.join(*p) for p in tree[:3] + tree[4:6])
  assert stage.write_token(SECRET) == stage.token and os.stat(stage.token).st_mode & 0o777 == 0o600


def test_gcloud_local_synchronizer_and_the_script_dry_run():
  command = [
      sys.executable,
      "scripts/tpu/commands.py",
      "--config=configs/shakespeare.py:mode=decoupled",
  ]
  command += [*TPU_FLAGS, "--noplan"]  # tests/test_plan.py runs the plan of a dry run
  # v5p-16 is two hosts per slice: the default workdir, each worker's $HOME, is refused by name
  refused = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
  assert refused.returncode != 0 and not refused.stdout.strip()
  assert "--workdir=$HOME/runs/diloco is each worker's own disk" in refused.stderr
  assert "2 hosts per slice" in refused.stderr
  out = subprocess.run(
      command + ["--workdir=/mnt/shared/runs"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
  )
  lines = out.stdout.strip().splitlines()
  assert "dry run" in out.stderr and "plan skipped (--noplan)" in out.stderr
  assert len(lines) == 1 + 1 + 3 * 2
  sync = shlex.split(shlex.split(lines[1])[2].split("setsid nohup ", 1)[1].split(" >> ")[0])
  assert sync[:3] == ["python", "-m", "experiments.supervise"]
  assert "experiments.synchronizer" in sync and "--config.deploy.bind=10.0.0.2" in sync


def test_gcloud_sweep_launches_every_point(tmp_path):
  toy = tmp_path / "toy_sweep.py"
  toy.write_text(
      "from configs import shakespeare\n"
      "get_config = shakespeare.get_config\n"
      "def get_sweep(arg=None):\n"
      "  return [{'mode': 'dp'}, {'mode': 'diloco', 'learners': 2, 'config.outer.lr': 0.5}]\n"
  )
  flags = tuple(f for f in TPU_FLAGS if "outer.learners" not in f)
  cmds = gcloud.sweep_commands(f"{toy}:runlocal", flags, "/runs/s")
  # the pack; point 0 (dp): a header, create, copy, train; point 1: a header, the synchronizer,
  # create/copy/start for each of its 2 learners.
  assert len(cmds) == 1 + (1 + 3) + (1 + 1 + 3 * 2)
  assert cmds[1] == ["echo", "# point 0: mode=dp"]
  train = _remote(cmds[4])
  assert "experiments.train" in train and f"--config={toy}:runlocal,mode=dp" in train
  assert "diloco-p0-dp" in cmds[4] and "--workdir=/runs/s/mode=dp" in train
  sync = cmds[6][2]
  assert "--config.outer.lr=0.5" in sync and "learners=2" in sync
  assert "diloco-p1-learner1" in cmds[12] and "--learner_id=1" in _remote(cmds[12])


def test_bad_settings_fail_before_anything_is_created():
  spec = "c.py"
  cases = [
      ((), "deploy.tpu.project is required"),
      (("--config.deploy.tpu.project=p", "--config.deploy.tpu.zone="), "deploy.tpu.zone"),
      (TPU_FLAGS + ("--config.deploy.tpu.accelerator_type=v5p-12",), "accelerator_type='v5p-12'"),
      (TPU_FLAGS + ("--config.deploy.tpu.accelerator_type=h100",), "not a Cloud TPU accelerator"),
      (TPU_FLAGS + ("--config.deploy.tpu.slices=a,b,c",), "names 3 slices .* outer.learners=2"),
      (TPU_FLAGS + ("--config.deploy.tpu.sync_host=",), "deploy.tpu.sync_host is required"),
      (TPU_FLAGS + ("--config.deploy.port=0",), "deploy.port must be set"),
      (TPU_FLAGS + ("--config.deploy.expect_platform=tpuu",), "deploy.expect_platform"),
  ]
  for flags, message in cases:
    with pytest.raises(ValueError, match=message):
      gcloud.commands(spec, _config(*flags), flags)
  c = _config(*TPU_FLAGS, "--config.deploy.tpu.slices=s-a, s-b")
  assert gcloud.slice_names(c) == ["s-a", "s-b"]
  with pytest.raises(ValueError, match="deploy.xpk.cluster is required"):
    xpk.commands(spec, _config(*TPU_FLAGS), TPU_FLAGS)
  assert cli.config_overrides(["--x=1", "--config.a=2", "--config.b", "3"]) == (
      "--config.a=2",
      "--config.b=3",
  )


# ---- xpk ----


def test_xpk_workloads_read_the_token_from_a_kubernetes_secret(tmp_path):
  spec = "configs/shakespeare.py:mode=decoupled"
  flags = TPU_FLAGS + ("--config.deploy.xpk.cluster=c1",)
  stage = staging.Stage(str(tmp_path / "stage"))
  cmds = xpk.commands(spec, _config(*flags), flags, "/data/d", stage)
  assert all(SECRET not in a for cmd in cmds for a in cmd)
  secret, role, binding = (cmd[2] for cmd in cmds[2:5])
  assert (
      f"create secret generic diloco-token --namespace default --from-file=token={stage.token}"
      in secret
  )
  assert "--resource-name=diloco-token" in role and "--verb=get" in role
  assert "--serviceaccount=default:default" in binding
  sync, *learners = cmds[5:]
  assert len(learners) == 2 and "--workload=diloco-sync" in sync
  assert "--device-type=n2-standard-32-1" in sync and "--max-restarts=20" in sync
  assert "--config.deploy.bind=0.0.0.0" in _remote(sync)
  for m, w in enumerate(learners):
    assert w[:3] == ["xpk", "workload", "create"] and f"--workload=diloco-learner{m}" in w
    assert "--tpu-type=v5p-16" in w and "--restart-on-user-code-failure" in w
    assert f"--script-dir={stage.dir}/src" in w
    command = _remote(w)
    assert command.startswith("pip install -q -e '.[tpu]' && python -m experiments.learner")
    for flag in (f"--config={spec}", *flags, "--config.distributed=True", f"--learner_id={m}"):
      assert flag in shlex.split(command), flag
    assert "--token_from=k8s:default/diloco-token/token" in command
    assert "--synchronizer=diloco-sync-slice-job-0-0.diloco-sync:6000" in command


def test_synchronizer_shards_on_cpu_hosts_gcloud_and_xpk(tmp_path):
  spec = "configs/shakespeare.py:mode=decoupled"
  shards = ("--config.outer.sync_shards=2",)
  stage = staging.Stage(str(tmp_path / "stage"))
  # gcloud, two CPU VMs: each created and given the code, then its shard started on deploy.port.
  flags = (
      TPU_FLAGS[:-1]
      + shards
      + (
          "--config.deploy.tpu.sync_host=10.0.0.2,10.0.0.3",
          "--config.deploy.tpu.sync_vm=dsync0,dsync1",
      )
  )
  cmds = gcloud.commands(spec, _config(*flags), flags, "/w", stage)
  starts = [c for c in cmds if c[:3] == ["gcloud", "compute", "ssh"]]
  assert [c[3] for c in starts] == ["dsync0", "dsync1"]
  for s, start in enumerate(starts):
    words = shlex.split(_remote(start).rsplit("setsid nohup ", 1)[1].split(" >> ")[0])
    assert f"--shard={s}" in words and f"--workdir=/w/sync{s}" in words
    assert f"--config.deploy.bind=10.0.0.{2 + s}" in words and "--config.deploy.port=6000" in words
  learner = _remote(cmds[-1])
  assert "--synchronizer=10.0.0.2:6000,10.0.0.3:6000" in learner
  # One host for both shards: ports 6000 and 6001 there.
  flags = TPU_FLAGS + shards
  cmds = gcloud.commands(spec, _config(*flags), flags, "/w", stage)
  assert "--synchronizer=10.0.0.2:6000,10.0.0.2:6001" in _remote(cmds[-1])
  bad = TPU_FLAGS[:-1] + shards + ("--config.deploy.tpu.sync_host=10.0.0.2,10.0.0.3,10.0.0.4",)
  with pytest.raises(ValueError, match="names 3 addresses .* for outer.sync_shards=2"):
    gcloud.commands(spec, _config(*bad), bad, "/w", stage)
  # xpk: a CPU workload per shard, learners given both JobSet addresses.
  flags = TPU_FLAGS + shards + ("--config.deploy.xpk.cluster=c1",)
  cmds = xpk.commands(spec, _config(*flags), flags, "/data/d", stage)
  sync0, sync1, *learners = cmds[5:]
  assert "--workload=diloco-sync0" in sync0 and "--workload=diloco-sync1" in sync1
  assert "--shard=1" in _remote(sync1) and "--workdir=/data/d/sync1" in _remote(sync1)
  assert len(learners) == 2 and (
      "--synchronizer=diloco-sync0-slice-job-0-0.diloco-sync0:6000,"
      "diloco-sync1-slice-job-0-0.diloco-sync1:6000"
  ) in _remote(learners[0])


# ---- Ray's plan ----


def test_ray_plan_checks_learners_and_the_tpu_slice():
  c = _config(*TPU_FLAGS)
  p = ray_launch.plan(c, 2, tpu=False)
  assert (p.learners, p.hosts_per_learner, p.topology) == (2, 1, "")
  assert (p.policy.max_restarts, p.policy.backoff_s) == (20, 5.0)
  with pytest.raises(ValueError, match="--learners=3 but outer.learners=2"):
    ray_launch.plan(c, 3, tpu=False)
  with pytest.raises(ValueError, match="deploy.tpu.topology is required"):
    ray_launch.plan(c, 2, tpu=True)
  c.deploy.tpu.topology = "2x2x2"
  p = ray_launch.plan(c, 2, tpu=True)
  assert (p.hosts_per_learner, p.topology, p.generation) == (2, "2x2x2", "v5p")
  c.deploy.tpu.accelerator_type = "v5p-15"
  with pytest.raises(ValueError, match="deploy.tpu.accelerator_type"):
    ray_launch.plan(c, 2, tpu=True)


# ---- recovery figures ----


def test_recovery_times_by_hand():
  from diloco.chaos import recovery_times  # pylint: disable=import-outside-toplevel

  merges = [
      {"time": t, "learners": l}
      for t, l in [(1, [0, 1]), (3, [0]), (4, [0]), (9, [0]), (12, [1]), (13, [0, 1]), (20, [0])]
  ]
  kills = [{"time": 2.0, "process": "learner1"}, {"time": 15.0, "process": "sync"}]
  rep = recovery_times.recovery(merges, kills, {0: [0.5], 1: [0.5, 8.0]}, learners=2)
  # Learner 1: killed at 2, restored at 8 (6 s), first merge with it after that at 12 (10 s);
  # learner 0 merged at 3, 4, 9 meanwhile: gaps 1, 1, 5 and 3 to t=12, the longest 5.
  assert rep["learner_kills"] == [
      {
          "learner": 1,
          "killed_at": 2.0,
          "restart_s": 6.0,
          "first_merge_s": 10.0,
          "survivors_longest_pause_s": 5,
      }
  ]
  assert rep["sync_kills"] == [{"killed_at": 15.0, "first_merge_s": 5.0}]  # next merge at 20
  assert recovery_times.worst(rep) == {
      "learner_kill_to_first_merge_s": 10.0,
      "sync_kill_to_next_merge_s": 5.0,
      "survivors_longest_pause_s": 5,
  }
  plan = recovery_times.kill_plan(3, 150.0, 4, 2, 0.25)
  assert [n for _, n in plan] == ["learner0", "learner1", "learner0", "sync"]
  assert all(7.5 <= t <= 127.5 for t, _ in plan) and plan == sorted(plan)
