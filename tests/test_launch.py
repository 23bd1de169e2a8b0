"""Launch tooling: self-signed TLS on a live server, the deploy config section (the Cloud TPU,
XPK and Ray launchers: tests/test_cluster_launch.py)."""

import importlib.util
import os

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
    self.versions = [0, 0]  # (what a Join is answered with)

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
  assert (c.deploy.bind, c.deploy.port) == ("127.0.0.1", 0)
  assert "runtime" not in c.deploy  # the runtime is the command: experiments.train, learner, ...
  deploy_lib.check(c.deploy)
  c.deploy.cert = "a.pem"
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
