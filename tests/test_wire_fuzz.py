"""Generated bad input against a live gRPC synchronizer: random bytes for every method, mangled
chunk streams (truncated, reordered, duplicated, fields rewritten), replayed uploads, missing and
wrong tokens. The server answers each with a clear status (never UNKNOWN or INTERNAL, which an
exception escaping a handler would give), stays up, and the synchronizer's digest does not change.
"""

import collections

import grpc
from hypothesis import HealthCheck, given, settings, strategies as st

from diloco.rpc import synchronizer_pb2 as pb, transport
from test_wire_input import TOKEN, _chunks, _raw_call, _upload, live  # noqa: F401  (fixture)

CLEAR = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,  # a stale, duplicate or unknown base version
    grpc.StatusCode.DATA_LOSS,  # an upload whose checksum fails
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
}
METHODS = {"Join": "unary_unary", "Progress": "unary_unary", "Poll": "unary_stream"}
ANSWERS: collections.Counter = collections.Counter()  # (method, status) -> count, for the record
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _answer(live, method, fn) -> str:
  """Calls fn; the status name: OK, or a clear error that left the state digest unchanged."""
  before = live["sync"].digest()
  try:
    fn()
    status = "OK"  # a mangling that left a valid message (one chunk reordered, say)
  except grpc.RpcError as e:
    assert e.code() in CLEAR, f"{method}: {e.code()} {e.details()}"
    assert e.details(), f"{method}: {e.code()} without a message"
    assert live["sync"].digest() == before, method
    status = e.code().name
  ANSWERS[(method, status)] += 1
  return status


@SETTINGS
@given(method=st.sampled_from(sorted(METHODS)), payload=st.binary(max_size=300))
def test_random_bytes_to_every_unary_method(live, method, payload):
  _answer(live, method, lambda: _raw_call(live["port"], method, payload, METHODS[method]))


@SETTINGS
@given(chunks=st.lists(st.binary(max_size=200), max_size=6))
def test_random_chunk_streams(live, chunks):
  _answer(live, "Upload", lambda: _raw_call(live["port"], "Upload", iter(chunks), "stream_unary"))


def _mangle(msgs, how, field, value, i):
  msgs = list(msgs)
  if how == "truncate":
    return msgs[: i % max(len(msgs), 1)]
  if how == "reorder":
    return msgs[::-1]
  if how == "duplicate":
    return msgs + [msgs[i % len(msgs)]]
  out = pb.Chunk()
  out.CopyFrom(msgs[i % len(msgs)])
  if field == "data":
    out.data = out.data[: value % (len(out.data) + 1)] + bytes([value % 256])
  else:
    setattr(out, field, str(value) if field == "session" else value)
  msgs[i % len(msgs)] = out
  return msgs


@SETTINGS
@given(
    how=st.sampled_from(["truncate", "reorder", "duplicate", "rewrite"]),
    field=st.sampled_from(
        ["learner", "session", "fragment", "index", "total", "length", "crc", "data"]
    ),
    value=st.integers(0, 2**31 - 1),
    i=st.integers(0, 50),
)
def test_mangled_chunk_streams_of_a_real_upload(live, how, field, value, i):
  data = transport.encode_message(_upload(live))
  chunks = _chunks(live, data, mutate=lambda m: _mangle(m, how, field, value, i))
  _answer(live, "Upload", lambda: _raw_call(live["port"], "Upload", iter(chunks), "stream_unary"))


@SETTINGS
@given(
    # printable ASCII: other values grpc's client refuses to send (INTERNAL "Invalid metadata")
    token=st.one_of(st.none(), st.text(st.characters(min_codepoint=33, max_codepoint=126))),
    method=st.sampled_from(sorted(METHODS)),
)
def test_missing_or_wrong_tokens(live, token, method):
  if token == TOKEN:
    return
  status = _answer(
      live, method, lambda: _raw_call(live["port"], method, b"", METHODS[method], token=token)
  )
  assert status == "UNAUTHENTICATED"


def test_replayed_upload_is_refused_and_the_server_is_still_up(live):
  data = transport.encode_message(_upload(live, p=1))
  chunks = _chunks(live, data, fragment=1)
  first = _answer(
      live, "Upload", lambda: _raw_call(live["port"], "Upload", iter(chunks), "stream_unary")
  )
  del first  # accepted or not (the round may need others), its replay must be refused
  before = live["sync"].digest()
  try:
    _raw_call(live["port"], "Upload", iter(chunks), "stream_unary")
    replay = "OK"
  except grpc.RpcError as e:
    assert e.code() in CLEAR
    replay = e.code().name
  assert replay != "OK" or live["sync"].digest() == before
  # Still serving: a well-formed Progress call from the joined learner is answered.
  _raw_call(
      live["port"],
      "Progress",
      pb.ProgressRequest(learner=0, session=live["link"].session).SerializeToString(),
  )
  print("wire fuzz answers:", dict(ANSWERS))
