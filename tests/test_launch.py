"""Launch tooling: Cloud TPU commands (dry run), self-signed TLS on a live server, deploy config."""

import importlib.util
import os
import shlex
import subprocess
import sys

import pytest

from diloco import deploy_config
from diloco.rpc import client as client_lib, limits as limits_lib, service
from diloco.runtime import realtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(rel):
    spec = importlib.util.spec_from_file_location(rel.replace("/", "_"), os.path.join(REPO, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tpu_dry_run_prints_the_deployment():
    out = subprocess.run(
        [sys.executable, "scripts/tpu/commands.py", "--config=configs/shakespeare.py:mode=decoupled",
         "--learners=2", "--project=proj", "--zone=z1", "--accelerator_type=v5p-16",
         "--sync_host=10.0.0.2", "--port=6000"], cwd=REPO, capture_output=True, text=True,
        timeout=60, check=True)
    lines = out.stdout.strip().splitlines()
    assert "dry run" in out.stderr
    assert len(lines) == 1 + 3 * 2  # synchronizer, then create/copy/start per learner slice
    sync = shlex.split(lines[0])
    assert sync[:2] == ["bash", "-c"] and "--bind=10.0.0.2" in sync[2] and "--port=6000" in sync[2]
    create = shlex.split(lines[1])[2]
    assert ("gcloud compute tpus tpu-vm describe diloco-learner0 --zone=z1 --project=proj"
            in create)
    assert "create diloco-learner0 --accelerator-type=v5p-16" in create
    assert shlex.split(lines[2])[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse"]
    start = shlex.split(lines[6])
    assert start[4:7] == ["ssh", "diloco-learner1", "--worker=all"]
    assert "--learner_id=1 --synchronizer=10.0.0.2:6000" in start[7]
    assert "--config.distributed=True" in start[7]


def test_tpu_commands_reject_missing_settings():
    tpu = _load("scripts/tpu/commands.py")
    with pytest.raises(ValueError, match="--project and --sync_host"):
        tpu.commands("c.py", 2, "", "z", "v4-8", "v", "")
    with pytest.raises(ValueError, match="at least one learner"):
        tpu.commands("c.py", 0, "p", "z", "v4-8", "v", "h")


class _FakeFrag:
    num_fragments = 2


class _FakeSync:
    """Enough of a Synchronizer for registration over TLS."""

    def __init__(self):
        self.frag, self.live, self.members, self.pending, self.generation = (
            _FakeFrag(), set(), set(), [{}, {}], 0)

    def handle(self, event):
        self.live.add(event.learner)
        self.members.add(event.learner)
        return []


def test_tls_with_self_signed_pair(tmp_path):
    cert, key = _load("scripts/make_certs.py").make_self_signed(str(tmp_path))
    host = realtime.SyncHost(_FakeSync())
    server, _, port = service.serve(host, "tok", cert=cert, key=key)
    try:
        # localhost matches the certificate's name; plaintext against a TLS port fails.
        link = client_lib.GrpcLink(f"localhost:{port}", 0, "tok", ca_cert=cert,
                                   limits=limits_lib.Limits(call_timeout_s=5.0))
        link.join((0, 0), ())
        assert host.sync.live == {0}
        plain = client_lib.GrpcLink(f"localhost:{port}", 1, "tok",
                                    limits=limits_lib.Limits(call_timeout_s=2.0))
        with pytest.raises(realtime.Unreachable):
            plain.join((0, 0), ())
        assert host.sync.live == {0}
        link.close()
        plain.close()
    finally:
        server.stop(0).wait()
        host.close()


def test_deploy_section_and_checks():
    import ml_collections
    c = deploy_config.add_deploy_section(ml_collections.ConfigDict())
    assert (c.deploy.runtime, c.deploy.bind, c.deploy.port) == ("virtual", "127.0.0.1", 0)
    deploy_config.check(c.deploy)
    c.deploy.runtime = "mpi"
    with pytest.raises(ValueError, match="deploy.runtime must be one of"):
        deploy_config.check(c.deploy)
    c.deploy.runtime, c.deploy.cert = "grpc", "a.pem"
    with pytest.raises(ValueError, match="go together"):
        deploy_config.check(c.deploy)
    with pytest.raises(ValueError, match="chunk_bytes"):
        limits_lib.Limits(chunk_bytes=4 << 20)
    with pytest.raises(ValueError, match="non-empty shared token"):
        service.Service(None, "", limits_lib.Limits())
