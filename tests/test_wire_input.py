"""Bad input over the wire against a live synchronizer service: each gets a clear gRPC status, is
counted, and leaves the synchronizer's durable state (its digest) unchanged."""

import dataclasses
import zlib

import grpc
import numpy as np
import pytest

from configs import shakespeare
from diloco.outer import protocol
from diloco.outer.codecs import compression
from diloco.rpc import client as client_lib, limits as limits_lib, security, service, synchronizer_pb2 as pb, transport
from diloco.runtime import link as link_lib, sync_host, threads

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def live():
  config = shakespeare.get_config("mode=decoupled,runlocal")
  parts, learners = threads.build_parts(config)
  sync = parts.make_sync()
  host = sync_host.SyncHost(sync, absent_after_s=30.0, progress_per_s=5.0, max_learners=3)
  limits = limits_lib.Limits(
      chunk_bytes=256,
      max_message_bytes=2048,
      max_chunks=1024,
      max_upload_bytes=1024 * 256,
      max_learners=3,
  )
  server, svc, port = service.serve(host, TOKEN, port=0, limits=limits)
  link = client_lib.GrpcLink(f"127.0.0.1:{port}", 0, TOKEN, limits=limits)
  link.join(tuple([-1] * config.outer.fragments), ())
  learner = learners[0]
  for s in link.poll(1.0):
    learner.receive(s)
  yield dict(
      host=host,
      svc=svc,
      port=port,
      link=link,
      learner=learner,
      sync=sync,
      limits=limits,
      config=config,
  )
  link.close()
  server.stop(0).wait()
  host.close()


def _raw_call(port, method, payload, kind="unary_unary", token=TOKEN):
  ch = grpc.insecure_channel(f"127.0.0.1:{port}")
  try:
    fn = getattr(ch, kind)(
        f"/{service.SERVICE}/{method}", request_serializer=None, response_deserializer=None
    )
    md = ((security.TOKEN_KEY, token),) if token is not None else ()
    result = fn(payload, timeout=5, metadata=md)
    return list(result) if kind == "unary_stream" else result
  finally:
    ch.close()


def _expect(live, code, match, fn, counter):
  before, counts = live["sync"].digest(), dict(live["host"].counts)
  with pytest.raises(grpc.RpcError) as err:
    fn()
  assert err.value.code() == code, err.value.details()
  assert match in err.value.details()
  assert live["host"].counts.get(counter, 0) == counts.get(counter, 0) + 1
  assert live["sync"].digest() == before


def _upload(live, p=0):
  learner = live["learner"]
  learner.c_steps[p], learner.c_tokens[p] = 3, 300
  return learner.upload(p, 0.0, 0.0, 0.1)


def _chunks(live, data, fragment=0, session=None, mutate=None):
  link = live["link"]
  pieces = transport.split(data, live["limits"].chunk_bytes)
  msgs = [
      pb.Chunk(
          learner=0,
          session=session or link.session,
          fragment=fragment,
          index=p.index,
          total=p.total,
          length=p.length,
          crc=p.crc,
          data=p.data,
      )
      for p in pieces
  ]
  msgs = mutate(msgs) if mutate else msgs
  return [m.SerializeToString() for m in msgs]


def test_token_required(live):
  for token in (None, "wrong"):
    _expect(
        live,
        grpc.StatusCode.UNAUTHENTICATED,
        "x-diloco-token",
        lambda: _raw_call(live["port"], "Progress", b"", token=token),
        "unauthenticated",
    )


def test_malformed_protobuf(live):
  _expect(
      live,
      grpc.StatusCode.INVALID_ARGUMENT,
      "malformed ProgressRequest",
      lambda: _raw_call(live["port"], "Progress", b"\xff\xff\xff"),
      "malformed",
  )


@pytest.mark.parametrize(
    "mutate,code,match,status",
    [
        (lambda m: m[:-1], "truncated", "stream ended after", grpc.StatusCode.INVALID_ARGUMENT),
        (
            lambda m: [m[1], m[0]] + m[2:],
            "out_of_order",
            "arrived, expected 0",
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            lambda m: [m[0], m[0]] + m[1:],
            "duplicate_chunk",
            "arrived twice",
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            lambda m: [_flip(m[0])] + m[1:],
            "checksum",
            "fails its CRC-32",
            grpc.StatusCode.DATA_LOSS,
        ),
    ],
)
def test_chunk_streams(live, mutate, code, match, status):
  data = transport.encode_message(_upload(live))
  chunks = _chunks(live, data, mutate=mutate)
  assert len(chunks) >= 2
  _expect(
      live,
      status,
      match,
      lambda: _raw_call(live["port"], "Upload", iter(chunks), "stream_unary"),
      code,
  )


def _flip(chunk):
  out = pb.Chunk()
  out.CopyFrom(chunk)
  out.data = bytes([chunk.data[0] ^ 1]) + chunk.data[1:]
  return out


def test_oversized_upload_and_too_many_chunks(live):
  big = pb.Chunk(
      learner=0,
      session=live["link"].session,
      index=0,
      total=1,
      length=live["limits"].max_upload_bytes + 1,
      crc=0,
      data=b"",
  )
  _expect(
      live,
      grpc.StatusCode.RESOURCE_EXHAUSTED,
      "exceeds",
      lambda: _raw_call(live["port"], "Upload", iter([big.SerializeToString()]), "stream_unary"),
      "too_large",
  )
  many = pb.Chunk(learner=0, session=live["link"].session, index=0, total=1025, length=1, crc=0)
  _expect(
      live,
      grpc.StatusCode.INVALID_ARGUMENT,
      "1025 chunks",
      lambda: _raw_call(live["port"], "Upload", iter([many.SerializeToString()]), "stream_unary"),
      "too_many_chunks",
  )


def _reupload(live, up, **changes):
  data = transport.encode_message(dataclasses.replace(up, checksum=None, **changes))
  return lambda: _raw_call(
      live["port"], "Upload", iter(_chunks(live, data, changes.get("fragment", 0))), "stream_unary"
  )


def test_wrong_fragment_shape_dtype_and_versions(live):
  up = _upload(live)
  _expect(
      live,
      grpc.StatusCode.INVALID_ARGUMENT,
      "unknown fragment 99",
      _reupload(live, up, fragment=99),
      "unknown_fragment",
  )
  path = sorted(up.delta)[0]
  e = up.delta[path]
  wrong_shape = {**up.delta, path: compression.encode(np.zeros((3, 5)), e.codec)}
  _expect(
      live,
      grpc.StatusCode.INVALID_ARGUMENT,
      "has shape (3, 5)",
      _reupload(live, up, delta=wrong_shape),
      "shape",
  )
  # fp32 values where the synchronizer expects encoded outer gradients of another codec.
  bad_dtype = dataclasses.replace(e, codec="int8", payload=b"\x00" * 3)
  _expect(
      live,
      grpc.StatusCode.INVALID_ARGUMENT,
      "do not hold shape",
      _reupload(live, up, delta={**up.delta, path: bad_dtype}),
      "shape",
  )
  _expect(
      live,
      grpc.StatusCode.ABORTED,
      "unknown base version 7",
      _reupload(live, up, base_version=7),
      "unknown_base_version",
  )
  # The same upload in order and intact is accepted (and changes the state).
  before = live["sync"].digest()
  _reupload(live, up)()
  assert live["sync"].digest() != before


def test_registration_limits_and_progress_flood(live):
  other = client_lib.GrpcLink(f"127.0.0.1:{live['port']}", 0, TOKEN, limits=live["limits"])
  n = live["config"].outer.fragments
  before = live["sync"].digest()
  with pytest.raises(link_lib.Refused, match="held by a live process"):
    other.join(tuple([0] * n), ())
  for m in (1, 2):
    client_lib.GrpcLink(f"127.0.0.1:{live['port']}", m, TOKEN).join(tuple([0] * n), ())
  with pytest.raises(link_lib.Refused, match="3 learners registered"):
    client_lib.GrpcLink(f"127.0.0.1:{live['port']}", 3, TOKEN).join(tuple([0] * n), ())
  assert live["host"].counts["already_exists"] == 1 and live["host"].counts["too_many"] == 1
  other.close()
  digest = live["sync"].digest()
  with pytest.raises(link_lib.Refused, match="more than 5.0/s"):
    for _ in range(20):
      live["link"].progress(False)
  assert live["host"].counts["rate_limited"] == 1
  assert live["sync"].digest() == digest
  del before


def test_wire_bytes_counted(live):
  svc, link = live["svc"], live["link"]
  assert link.bytes_sent > 0 and link.bytes_received > 0
  assert svc.bytes_received >= link.bytes_sent  # the server also saw the raw calls


def test_messages_round_trip_field_by_field():
  values = {"a/b": np.arange(6, dtype=np.float32).reshape(2, 3)}
  send = protocol.Send(learner=2, fragment=1, version=5, values=values, generation=3)
  back = transport.decode_message(transport.encode_message(send))
  assert (back.learner, back.fragment, back.version, back.generation) == (2, 1, 5, 3)
  assert back.checksum == send.checksum and back.checksum_ok()
  np.testing.assert_array_equal(back.values["a/b"], values["a/b"])
  join = protocol.Join(1, 0.5, (0, -1), (2, 2))
  assert transport.decode_message(transport.encode_message(join)) == join
  # The mark of a merge that holds the receiver's upload (issue 51) travels, and is checked.
  own = protocol.Send(learner=2, fragment=1, version=5, values=values, own=(1, 4, 8))
  back = transport.decode_message(transport.encode_message(own))
  plain = protocol.Send(learner=2, fragment=1, version=5, values=values)
  assert back.own == (1, 4, 8) and back.checksum_ok() and back.checksum != plain.checksum
  for forged in (None, (1, 4, 9)):  # the mark dropped, or another upload named
    flipped = dataclasses.replace(back, own=forged, checksum=back.checksum)
    assert not flipped.checksum_ok()


def test_malformed_messages_name_the_problem():
  data = transport.encode_message(protocol.Join(1, 0.5, (0,)))
  with pytest.raises(transport.WireError, match="bad magic"):
    transport.decode_message(b"XXXX" + data[4:])
  with pytest.raises(transport.WireError, match="trailing bytes"):
    transport.decode_message(data + b"\x00")
  with pytest.raises(transport.WireError, match="exceeds the 10 limit"):
    transport.decode_message(data, max_bytes=10)
  pieces = transport.split(b"x" * 10, 4)
  assert [(p.index, p.total, p.length, len(p.data)) for p in pieces] == [
      (0, 3, 10, 4),
      (1, 3, 10, 4),
      (2, 3, 10, 2),
  ]
  assert pieces[2].crc == zlib.crc32(b"xx")
