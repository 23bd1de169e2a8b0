"""Launch tooling: Cloud TPU commands (dry run), self-signed TLS on a live server, deploy config."""

import importlib.util
import os
import shlex
import subprocess
import sys

import pytest

from diloco.config import deploy as deploy_lib
from diloco.rpc import client as client_lib, limits as limits_lib, service
from diloco.runtime import link as link_lib, sync_host

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(rel):
  spec = importlib.util.spec_from_file_location(rel.replace("/", "_"), os.path.join(REPO, rel))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


TPU_FLAGS = [
    "--config.outer.learners=2",
    "--config.deploy.port=6000",
    "--config.deploy.tpu.project=proj",
    "--config.deploy.tpu.zone=z1",
    "--config.deploy.tpu.accelerator_type=v5p-16",
    "--config.deploy.tpu.sync_host=10.0.0.2",
]


def _tpu_commands(*args: str) -> subprocess.CompletedProcess:
  """scripts/tpu/commands.py's dry run with these arguments."""
  return subprocess.run(
      [sys.executable, "scripts/tpu/commands.py", *args],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
  )


def test_tpu_dry_run_prints_the_deployment():
  out = _tpu_commands(
      "--config=configs/shakespeare.py:mode=decoupled",
      *TPU_FLAGS,
      "--config.deploy.ca_cert",
      "certs/cert.pem",
  )
  lines = out.stdout.strip().splitlines()
  assert "dry run" in out.stderr
  assert len(lines) == 1 + 3 * 2  # synchronizer, then create/copy/start per learner slice
  sync = shlex.split(lines[0])
  assert sync[:2] == ["bash", "-c"]
  sync_args = shlex.split(sync[2])
  assert sync_args[:4] == ["nohup", "python", "-m", "experiments.synchronizer"]
  assert "--config.deploy.bind=10.0.0.2" in sync_args and "--config.deploy.port=6000" in sync_args
  create = shlex.split(lines[1])[2]
  assert "gcloud compute tpus tpu-vm describe diloco-learner0 --zone=z1 --project=proj" in create
  assert "create diloco-learner0 --accelerator-type=v5p-16" in create
  assert shlex.split(lines[2])[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse"]
  start = shlex.split(lines[6])
  assert start[4:7] == ["ssh", "diloco-learner1", "--worker=all"]
  remote = shlex.split(start[7].split("=", 1)[1])
  # Every process gets the same config: the spec and every override, plus its own flags.
  for flag in [
      "--config=configs/shakespeare.py:mode=decoupled",
      *TPU_FLAGS,
      "--config.deploy.ca_cert=certs/cert.pem",
      "--config.distributed=True",
      "--learner_id=1",
      "--synchronizer=10.0.0.2:6000",
  ]:
    assert flag in remote, flag
    assert flag in sync_args or flag in (
        "--config.distributed=True",
        "--learner_id=1",
        "--synchronizer=10.0.0.2:6000",
    )
  assert "DILOCO_TOKEN=$DILOCO_TOKEN" in remote  # the name in a dry run, never a value


def test_tpu_sweep_dry_run_launches_every_point(tmp_path):
  toy = tmp_path / "toy_sweep.py"
  toy.write_text(
      "from configs import shakespeare\n"
      "get_config = shakespeare.get_config\n"
      "def get_sweep(arg=None):\n"
      "  return [{'mode': 'dp'}, {'mode': 'diloco', 'learners': 2, 'config.outer.lr': 0.5}]\n"
  )
  deploy_flags = [f for f in TPU_FLAGS if "outer.learners" not in f]
  out = _tpu_commands(f"--config={toy}:runlocal", "--sweep", *deploy_flags, "--workdir=/runs/s")
  lines = out.stdout.strip().splitlines()
  # point 0 (dp): a header, create, copy, train on one slice; point 1: a header, the synchronizer,
  # then create/copy/start for each of its 2 learners.
  assert len(lines) == (1 + 3) + (1 + 1 + 3 * 2)
  assert (
      lines[0] == "echo '# point 0: mode=dp'"
      and lines[4] == "echo '# point 1: mode=diloco+learners=2+outer.lr=0.5'"
  )
  train = shlex.split(shlex.split(lines[3])[7].split("=", 1)[1])
  assert train[train.index("-m") + 1] == "experiments.train"
  assert f"--config={toy}:runlocal,mode=dp" in train and "--workdir=/runs/s/mode=dp" in train
  assert "diloco-p0-dp" in lines[3] and "--config.deploy.tpu.name_prefix=diloco-p0" in train
  sync = shlex.split(shlex.split(lines[5])[2])
  assert f"--config={toy}:runlocal,mode=diloco,learners=2" in sync
  assert (
      "--config.outer.lr=0.5" in sync
      and "--workdir=/runs/s/mode=diloco+learners=2+outer.lr=0.5/sync" in sync
  )
  assert "diloco-p1-learner1" in lines[11] and "--learner_id=1" in lines[11]


def test_tpu_commands_reject_missing_settings():
  from configs import shakespeare

  tpu = _load("scripts/tpu/commands.py")
  c = shakespeare.get_config("mode=decoupled")
  with pytest.raises(ValueError, match="project and deploy.tpu.sync_host"):
    tpu.commands("c.py", c)
  c.deploy.tpu.project, c.deploy.tpu.sync_host = "p", "h"
  with pytest.raises(ValueError, match="deploy.port must be set"):
    tpu.commands("c.py", c)
  c.deploy.port = 7000
  c.deploy.bind = "0.0.0.0"  # an explicit bind is kept
  cmds = tpu.commands("c.py", c, token="t0k")
  assert "--config.deploy.bind" not in cmds[0][2]
  assert len(cmds) == 1 + 3 * c.outer.learners and "DILOCO_TOKEN=t0k" in cmds[3][-3]
  c.deploy.runtime = "mpi"
  with pytest.raises(ValueError, match="deploy.runtime must be one of"):
    tpu.commands("c.py", c)
  assert tpu.config_overrides(["--x=1", "--config.a=2", "--config.b", "3"]) == (
      "--config.a=2",
      "--config.b=3",
  )


class _FakeFrag:
  num_fragments = 2


class _FakeSync:
  """Enough of a Synchronizer for registration over TLS."""

  def __init__(self):
    self.frag, self.live, self.members, self.pending, self.generation = (
        _FakeFrag(),
        set(),
        set(),
        [{}, {}],
        0,
    )

  def handle(self, event):
    self.live.add(event.learner)
    self.members.add(event.learner)
    return []


def test_tls_with_self_signed_pair(tmp_path):
  cert, key = _load("scripts/make_certs.py").make_self_signed(str(tmp_path))
  host = sync_host.SyncHost(_FakeSync())
  server, _, port = service.serve(host, "tok", cert=cert, key=key)
  try:
    # localhost matches the certificate's name; plaintext against a TLS port fails.
    link = client_lib.GrpcLink(
        f"localhost:{port}", 0, "tok", ca_cert=cert, limits=limits_lib.Limits(call_timeout_s=5.0)
    )
    link.join((0, 0), ())
    assert host.sync.live == {0}
    plain = client_lib.GrpcLink(
        f"localhost:{port}", 1, "tok", limits=limits_lib.Limits(call_timeout_s=2.0)
    )
    with pytest.raises(link_lib.Unreachable):
      plain.join((0, 0), ())
    assert host.sync.live == {0}
    link.close()
    plain.close()
  finally:
    server.stop(0).wait()
    host.close()


def test_deploy_section_and_checks():
  import ml_collections

  c = deploy_lib.add_deploy_section(ml_collections.ConfigDict())
  assert (c.deploy.runtime, c.deploy.bind, c.deploy.port) == ("virtual", "127.0.0.1", 0)
  deploy_lib.check(c.deploy)
  c.deploy.runtime = "mpi"
  with pytest.raises(ValueError, match="deploy.runtime must be one of"):
    deploy_lib.check(c.deploy)
  c.deploy.runtime, c.deploy.cert = "grpc", "a.pem"
  with pytest.raises(ValueError, match="go together"):
    deploy_lib.check(c.deploy)
  c.deploy.cert = ""
  for key, bad, message in [
      ("absent_after_s", 0.0, "absent_after_s must be > 0"),
      ("port", 70000, "port out of range"),
      ("bind", "", "bind is empty"),
      ("max_learners", 0, "max_learners must be >= 1"),
      ("chunk_bytes", 4 << 20, "leaves no room"),
  ]:
    good = c.deploy[key]
    c.deploy[key] = bad
    with pytest.raises(ValueError, match=message):
      deploy_lib.check(c.deploy)
    c.deploy[key] = good
  deploy_lib.check(c.deploy)
  c.deploy.absent_after_s, c.deploy.max_learners, c.deploy.chunk_bytes = 2.5, 7, 1000
  lim = limits_lib.Limits.from_deploy(c.deploy)
  assert (lim.absent_after_s, lim.max_learners, lim.chunk_bytes) == (2.5, 7, 1000)
  assert lim.max_message_bytes == c.deploy.max_message_bytes
  with pytest.raises(ValueError, match="chunk_bytes"):
    limits_lib.Limits(chunk_bytes=4 << 20)
  with pytest.raises(ValueError, match="non-empty shared token"):
    service.Service(None, "", limits_lib.Limits())
