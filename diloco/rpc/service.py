"""The synchronizer's gRPC service: a thin, guarded skin over `sync_host.SyncHost`.

Handlers take raw request bytes and parse them here, so malformed protobuf bytes get a clear
INVALID_ARGUMENT (gRPC's own deserializer would answer a bare INTERNAL), and so that the bytes that
really crossed the wire are counted as they arrive and leave. Every call must carry the shared token
in its metadata (else UNAUTHENTICATED, logged and counted). gRPC runs handlers on a thread pool;
SyncHost takes one lock around each event it feeds the state machine, which does no I/O itself.

Delivery of sends uses long-polling (Poll: a server stream that returns the sends numbered after the
learner's acknowledgement as soon as one exists, or nothing after `wait_s`) rather than one endless
server stream per learner: every call then has a deadline, a dropped connection costs one poll and
loses nothing (unacknowledged sends stay in the outbox and come again), a poll doubles as a
heartbeat, and a restarted synchronizer needs no stream bookkeeping.
"""

import logging
import threading
from collections.abc import Iterator

import grpc
from google.protobuf import message as pb_message

from diloco.outer import outcomes
from diloco.outer.outcomes import Code
from diloco.recovery import crash_machine
from diloco.rpc import limits as limits_lib, security, synchronizer_pb2 as pb, transport
from diloco.runtime import link as link_lib, sync_host

SERVICE = "diloco.rpc.SynchronizerService"
# Every refusal code -> the gRPC status it travels with (the code itself travels in the trailing
# metadata under CODE_KEY, so a client reads exactly what was refused, not a status shared by
# several codes).
_S = grpc.StatusCode
RPC_CODES = {
    Code.UNAUTHENTICATED: _S.UNAUTHENTICATED,
    Code.MALFORMED: _S.INVALID_ARGUMENT,
    Code.INVALID: _S.INVALID_ARGUMENT,
    Code.UNKNOWN_FRAGMENT: _S.INVALID_ARGUMENT,
    Code.PATHS: _S.INVALID_ARGUMENT,
    Code.SHAPE: _S.INVALID_ARGUMENT,
    Code.PAYLOAD_SIZE: _S.INVALID_ARGUMENT,
    Code.NO_PROGRESS: _S.INVALID_ARGUMENT,
    Code.JOIN: _S.INVALID_ARGUMENT,
    Code.NON_FINITE: _S.INVALID_ARGUMENT,
    Code.OUTLIER: _S.INVALID_ARGUMENT,
    Code.NON_FINITE_MERGE: _S.INVALID_ARGUMENT,
    Code.CHECKSUM: _S.DATA_LOSS,
    Code.UNKNOWN_BASE_VERSION: _S.ABORTED,
    Code.STALE: _S.ABORTED,
    Code.DUPLICATE: _S.ABORTED,
    Code.NOT_JOINED: _S.FAILED_PRECONDITION,
    Code.ALREADY_EXISTS: _S.ALREADY_EXISTS,
    Code.TOO_MANY: _S.RESOURCE_EXHAUSTED,
    Code.TOO_LARGE: _S.RESOURCE_EXHAUSTED,
    Code.RATE_LIMITED: _S.RESOURCE_EXHAUSTED,
    Code.OLD_GENERATION: _S.FAILED_PRECONDITION,  # a learner's codes: never sent, mapped for
    Code.GAP: _S.FAILED_PRECONDITION,  # completeness
}
CODE_KEY = "diloco-refusal"
log = logging.getLogger(__name__)


def _cut_off(chunks: Iterator[bytes], on_cut) -> Iterator[bytes]:
  """`chunks`, calling `on_cut` when the stream breaks off (grpc raises inside the iterator)."""
  try:
    yield from chunks
  except grpc.RpcError:
    on_cut()
    raise


def _ended(context) -> bool:
  """Whether a call is over: cancelled, or its deadline passed (the state gRPC records a moment
  after it ends a request stream for that reason)."""
  remaining = context.time_remaining()
  return not context.is_active() or (remaining is not None and remaining <= 0)


class Service:
  """Handlers of SynchronizerService over one SyncHost."""

  def __init__(self, host: sync_host.SyncHost, token: str, limits: limits_lib.Limits):
    if not token:
      raise ValueError("the synchronizer needs a non-empty shared token")
    self.host, self.token, self.limits = host, token, limits
    self._lock = threading.Lock()
    self.bytes_received = 0
    self.bytes_sent = 0
    self.codec_bytes_up = 0  # the codec's own count of what was accepted and delivered
    self.codec_bytes_down = 0
    self.learner_bytes: dict[int, list[int]] = {}  # learner -> [received, sent] on the wire

  def _add(self, received: int = 0, sent: int = 0, learner: int | None = None) -> None:
    with self._lock:
      self.bytes_received += received
      self.bytes_sent += sent
      known = learner in self.learner_bytes
      if learner is not None and (known or len(self.learner_bytes) < self.limits.max_learners):
        counts = self.learner_bytes.setdefault(learner, [0, 0])
        counts[0] += received
        counts[1] += sent

  def bytes_of(self, learner: int) -> tuple[int, int]:
    """(received from, sent to) learner on the wire, so far."""
    with self._lock:
      return tuple(self.learner_bytes.get(learner, (0, 0)))

  def _fail(self, context: grpc.ServicerContext, code: Code, message: str):
    log.warning("refused (%s): %s", code, message)
    context.set_trailing_metadata(((CODE_KEY, code.value),))
    context.abort(RPC_CODES[code], message)

  def _auth(self, context: grpc.ServicerContext) -> None:
    if not security.token_ok(context.invocation_metadata(), self.token):
      self.host.count(Code.UNAUTHENTICATED)
      self._fail(context, Code.UNAUTHENTICATED, f"missing or wrong {security.TOKEN_KEY}")

  def _parse(self, cls, data: bytes, context: grpc.ServicerContext):
    try:
      msg = cls.FromString(data)
    except pb_message.DecodeError as err:
      self._add(received=len(data))
      self.host.count(Code.MALFORMED)
      self._fail(context, Code.MALFORMED, f"malformed {cls.__name__} bytes: {err}")
    self._add(received=len(data), learner=getattr(msg, "learner", None))
    return msg

  def _reply(self, msg, learner: int | None = None) -> bytes:
    data = msg.SerializeToString()
    self._add(sent=len(data), learner=learner)
    return data

  def join(self, data: bytes, context) -> bytes:
    self._auth(context)
    req = self._parse(pb.JoinRequest, data, context)
    try:
      gen, seq, joined = self.host.join(
          req.learner, req.session, tuple(req.versions), tuple(req.generations)
      )
    except link_lib.Refused as err:
      self._fail(context, err.code, str(err))
    previous = {}
    if joined.previous is not None:
      previous = dict(previous=_peer_state(joined.previous))
    return self._reply(
        pb.JoinReply(
            generation=gen,
            next_seq=seq,
            num_fragments=self.host.sync.frag.num_fragments,
            heartbeat_s=self.limits.absent_after_s / 4,
            versions=joined.versions,
            peers=[_peer_state(p) for p in joined.peers],
            silent_s=joined.silent_s,
            **previous,
        ),
        req.learner,
    )

  def progress(self, data: bytes, context) -> bytes:
    self._auth(context)
    req = self._parse(pb.ProgressRequest, data, context)
    try:
      report = dict(
          step=req.total_steps,
          tokens=req.total_tokens,
          loss=req.loss if req.HasField("loss") else None,
          finished=req.finished,
          start=req.start_step,
          session=req.session,
      )
      if req.c_steps:  # (a learner process's: where a restarted peer resumes)
        report["c_steps"] = list(req.c_steps)
      settled = self.host.progress(req.learner, req.session, finished=req.finished, report=report)
    except link_lib.Refused as err:
      self._fail(context, err.code, str(err))
    reply = pb.ProgressReply(generation=self.host.sync.generation, settled=settled)
    return self._reply(reply, req.learner)

  def upload(self, chunks: Iterator[bytes], context) -> bytes:
    self._auth(context)
    joiner = transport.Reassembler(self.limits.max_upload_bytes, self.limits.max_chunks)
    first, started, received = None, None, 0
    try:
      for data in _cut_off(chunks, lambda: self._cut(first, received)):
        c = self._parse(pb.Chunk, data, context)
        received += 1
        if first is None:
          first, started = c, self.host.now()
        if (c.learner, c.session, c.fragment) != (first.learner, first.session, first.fragment):
          raise transport.WireError(
              "inconsistent",
              "chunks of one upload name different learners, sessions or fragments",
          )
        joiner.add(transport.Piece(c.index, c.total, c.length, c.crc, c.data))
      if _ended(context):  # its deadline passed mid-stream (a silent learner cannot cancel):
        self._cut(first, received)  # gRPC may end the chunks as if they were all there
        return b""  # (nobody waits for this answer)
      up = transport.decode_message(joiner.done(), self.limits.max_upload_bytes)
      if not isinstance(up, transport.protocol.Upload):
        raise transport.WireError("malformed", f"expected an Upload, got {type(up).__name__}")
      if up.fragment != first.fragment:
        raise transport.WireError(
            "invalid",
            f"chunks name fragment {first.fragment}, the upload inside fragment {up.fragment}",
        )
    except transport.WireError as err:
      code = outcomes.find(err.code) or Code.MALFORMED
      self.host.count(err.code)  # by the wire's own finer name (truncated, out_of_order, ...)
      self._fail(context, code, str(err))
    try:
      merges = self.host.upload(first.learner, first.session, up, started)
    except link_lib.Refused as err:
      self._fail(context, err.code, str(err))
    with self._lock:
      self.codec_bytes_up += up.nbytes
    reply = pb.UploadReply(generation=self.host.sync.generation, merges=merges)
    return self._reply(reply, first.learner)

  def _cut(self, first, received: int) -> None:
    """An upload's stream broke off after `received` chunks (the call cancelled, its connection
    gone): nothing of it reaches the synchronizer; counted and logged."""
    self.host.count("upload_cut")
    row = {"event": "upload_cut", "chunks": received, "time": self.host.now()}
    if first is not None:
      row.update(learner=first.learner, fragment=first.fragment, of=first.total)
    self.host.on_log(row)

  def poll(self, data: bytes, context) -> Iterator[bytes]:
    self._auth(context)
    req = self._parse(pb.PollRequest, data, context)
    wait = min(max(req.wait_s, 0.0), self.limits.poll_wait_s)
    try:
      sends = self.host.poll(req.learner, req.session, req.after_seq, wait)
    except link_lib.Refused as err:
      self._fail(context, err.code, str(err))
    for seq, send in sends:
      with self._lock:
        self.codec_bytes_down += getattr(send, "nbytes", 0)  # (a late refusal carries none)
      for chunk in chunks(send, self.limits.chunk_bytes, learner=req.learner, seq=seq):
        yield self._reply(chunk, req.learner)


def _peer_state(peer: crash_machine.Peer) -> pb.PeerState:
  return pb.PeerState(steps=peer.steps, c_steps=peer.c_steps)


def chunks(message, chunk_bytes: int, **header) -> Iterator[pb.Chunk]:
  """An Upload or Send as the Chunk messages of a stream, each with `header` (learner, session or
  seq) and the fragment: serialized and cut at once (errors surface here), built one by one."""
  pieces = transport.split(transport.encode_message(message), chunk_bytes)
  fields = dict(fragment=message.fragment, **header)
  return (
      pb.Chunk(index=p.index, total=p.total, length=p.length, crc=p.crc, data=p.data, **fields)
      for p in pieces
  )


def _raw(fn, kind):
  return kind(fn, request_deserializer=None, response_serializer=None)


def serve(
    host: sync_host.SyncHost,
    token: str,
    *,
    port: int = 0,
    bind: str = "127.0.0.1",
    limits: limits_lib.Limits = limits_lib.Limits(),
    cert: str = "",
    key: str = "",
    workers: int = 16,
) -> tuple[grpc.Server, Service, int]:
  """Starts the service on bind:port (0 = a free port); returns (server, service, port)."""
  from concurrent import futures

  svc = Service(host, token, limits)
  handlers = grpc.method_handlers_generic_handler(
      SERVICE,
      {
          "Join": _raw(svc.join, grpc.unary_unary_rpc_method_handler),
          "Progress": _raw(svc.progress, grpc.unary_unary_rpc_method_handler),
          "Upload": _raw(svc.upload, grpc.stream_unary_rpc_method_handler),
          "Poll": _raw(svc.poll, grpc.unary_stream_rpc_method_handler),
      },
  )
  options = limits.channel_options() + [
      ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
      ("grpc.http2.max_ping_strikes", 0),
      ("grpc.so_reuseport", 0),
  ]
  server = grpc.server(
      futures.ThreadPoolExecutor(max_workers=workers),
      options=options,
      maximum_concurrent_rpcs=workers * 4,
  )
  server.add_generic_rpc_handlers((handlers,))
  creds = security.server_credentials(cert, key)
  address = f"{bind}:{port}"
  bound = (
      server.add_secure_port(address, creds)
      if creds is not None
      else server.add_insecure_port(address)
  )
  if bound == 0:
    raise OSError(f"could not bind the synchronizer service to {address}")
  server.start()
  return server, svc, bound
