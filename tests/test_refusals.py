"""One refusal code from the synchronizer to the learner, over gRPC, whatever else is going on.

Synchronous DiLoCo (`mode=diloco,runlocal`: 2 learners, one fragment, every member in the
quorum). An upload with no progress is refused `no_progress`. Before the codes were typed, the
host refused it only when it was the synchronizer's one action: alone it was refused, but with the
peer's upload pending it let the peer's round merge and came back accepted (`merges=1`). Now it is
refused with the same code both times, and the peer's round still merges behind it.
"""

import dataclasses

import grpc
import pytest

from configs import shakespeare
from diloco.outer.outcomes import Code
from diloco.rpc import client as client_lib, service
from diloco.runtime import link as link_lib, sync_host, threads

TOKEN = "t0ken"


@pytest.fixture
def two():
  config = shakespeare.get_config("mode=diloco,runlocal")
  parts, learners = threads.build_parts(config)
  sync = parts.make_sync()
  host = sync_host.SyncHost(sync, absent_after_s=30.0)
  server, _, port = service.serve(host, TOKEN, port=0)
  links = [client_lib.GrpcLink(f"127.0.0.1:{port}", m, TOKEN) for m in (0, 1)]
  for link, learner in zip(links, learners):
    link.join(tuple(learner.versions), tuple(learner.generations))
    for s in link.poll(1.0):
      learner.receive(s)
  yield dict(host=host, sync=sync, links=links, learners=learners)
  for link in links:
    link.close()
  server.stop(0).wait()
  host.close()


def _upload(learner, steps):
  learner.c_steps[0], learner.c_tokens[0] = steps, 64 * steps
  return learner.upload(0, 0.0, 0.0, 0.1)


def _refusal(link, up) -> link_lib.Refused:
  with pytest.raises(link_lib.Refused) as err:
    link.upload(up)
  return err.value


def test_the_same_bad_upload_gets_the_same_code_alone_and_with_a_peer_pending(two):
  sync, host, (link0, link1), (l0, l1) = two["sync"], two["host"], two["links"], two["learners"]
  empty = _upload(l0, 0)
  link1.upload(_upload(l1, 3))  # waits for learner 0 (every member is in the quorum)
  assert sync.versions == [0] and 1 in sync.pending[0]
  with_peer = _refusal(link0, empty)
  assert with_peer.code is Code.NO_PROGRESS and "no progress to merge" in str(with_peer)
  # Its refusal let the round stop waiting for it: learner 1's upload merged alone.
  assert sync.versions == [1] and sync.pending == [{}] and host.counts["no_progress"] == 1

  alone = _refusal(link0, empty)  # nothing pending now: the synchronizer's only action
  assert alone.code is Code.NO_PROGRESS and host.counts["no_progress"] == 2
  assert sync.versions == [1] and sync.pending == [{}]


@pytest.mark.parametrize(
    "change, code, status",
    [
        (dict(base_version=7), Code.UNKNOWN_BASE_VERSION, grpc.StatusCode.ABORTED),
        (dict(checksum=12345), Code.CHECKSUM, grpc.StatusCode.DATA_LOSS),
        (dict(fragment=3), Code.UNKNOWN_FRAGMENT, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_the_client_reports_the_code_the_synchronizer_gave(two, change, code, status):
  sync, link0, l0 = two["sync"], two["links"][0], two["learners"][0]
  up = dataclasses.replace(_upload(l0, 2), **{"checksum": None, **change})
  refused = _refusal(link0, up)
  assert refused.code is code and code.value in str(refused)
  assert service.RPC_CODES[code] == status
  assert sync.pending == [{}] and two["host"].counts[code.value] == 1


def test_a_host_refusal_travels_as_its_own_code(two):
  """not_joined and stale used to share FAILED_PRECONDITION, and the client read both as not
  joined; each now arrives as itself."""
  host, link0, l0 = two["host"], two["links"][0], two["learners"][0]
  host.sessions[0] = "someone else"
  refused = _refusal(link0, _upload(l0, 1))
  assert refused.code is Code.NOT_JOINED
