"""A learner's gRPC link to the synchronizer (implements `link_lib.Link`).

Every call has a deadline and carries the shared token; the channel sends keepalive pings. Bytes
are counted from the serialized messages that gRPC actually sent and received. Network failures
become `link_lib.Unreachable` (the learner keeps training and retries with backoff); refusals
become `link_lib.Refused` with the server's refusal code (from the trailing metadata) and message.
"""

import threading
import uuid
from collections.abc import Callable

import grpc

from diloco.outer import outcomes, protocol
from diloco.recovery import crash_machine
from diloco.rpc import limits as limits_lib, security, service, synchronizer_pb2 as pb, transport
from diloco.runtime import link as link_lib

_UNREACHABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
)


def refusal_code(err: grpc.RpcError) -> outcomes.Code:
  """The refusal code the service put in the call's trailing metadata (`service.CODE_KEY`);
  a server that sent none (not ours) is INVALID."""
  for key, value in err.trailing_metadata() or ():
    if key == service.CODE_KEY and outcomes.find(value) is not None:
      return outcomes.find(value)
  return outcomes.Code.INVALID


class GrpcLink:
  """Join, Progress, Upload (client stream of chunks) and Poll (long-poll) over one channel."""

  def __init__(
      self,
      target: str,
      learner: int,
      token: str,
      *,
      limits: limits_lib.Limits = limits_lib.Limits(),
      ca_cert: str = "",
  ):
    self.learner, self.token, self.limits = learner, token, limits
    self.session = uuid.uuid4().hex
    creds = security.channel_credentials(ca_cert)
    options = limits.channel_options()
    self.channel = (
        grpc.secure_channel(target, creds, options=options)
        if creds is not None
        else grpc.insecure_channel(target, options=options)
    )
    self._lock = threading.Lock()
    self.bytes_sent = self.bytes_received = 0  # serialized gRPC messages, both directions
    self.codec_bytes_sent = self.codec_bytes_received = 0  # the codec's payload counts
    self.acked = 0
    self.generation = 0
    self.largest_upload = 0  # codec bytes of the largest upload so far (a poll's deadline)
    self.step_time, self.steps, self.tokens = 0.0, 0, 0
    # The learner's totals and last loss for the status page ({total_steps, total_tokens, loss}).
    self.report: Callable[[], dict] = dict
    # Told {"event": "unreachable", "code"} and {"event": "reachable"} as the link changes.
    self.on_link: Callable[[dict], None] = lambda event: None
    self.reachable = True
    self.last_settled = False

    def counted_out(data: bytes) -> bytes:
      self._add(sent=len(data))
      return data

    def counted_in(data: bytes) -> bytes:
      self._add(received=len(data))
      return data

    def method(name, kind, req_cls=None):
      ser = lambda m: counted_out(m.SerializeToString())
      return getattr(self.channel, kind)(
          f"/{service.SERVICE}/{name}", request_serializer=ser, response_deserializer=counted_in
      )

    self._join = method("Join", "unary_unary")
    self._progress = method("Progress", "unary_unary")
    self._upload = method("Upload", "stream_unary")
    self._poll = method("Poll", "unary_stream")

  def _add(self, sent: int = 0, received: int = 0) -> None:
    with self._lock:
      self.bytes_sent += sent
      self.bytes_received += received

  def _md(self):
    return ((security.TOKEN_KEY, self.token),)

  def _call(self, fn):
    try:
      out = fn()
    except grpc.RpcError as err:
      code = err.code() if hasattr(err, "code") else None
      if code in _UNREACHABLE or code is None:
        self._reached(False, code)
        raise link_lib.Unreachable(str(err)) from err
      self._reached(True)
      raise link_lib.Refused(refusal_code(err), err.details() or str(code)) from err
    self._reached(True)
    return out

  def _reached(self, ok: bool, code=None) -> None:
    """Tells `on_link` when the synchronizer stops answering (the first call given up) and when
    it answers again."""
    with self._lock:
      changed, self.reachable = ok != self.reachable, ok
    if changed:
      name = getattr(code, "name", str(code)).lower()
      self.on_link({"event": "reachable"} if ok else {"event": "unreachable", "code": name})

  def join(self, versions, generations) -> link_lib.Joined:
    req = pb.JoinRequest(
        learner=self.learner, session=self.session, versions=versions, generations=generations
    )
    reply = pb.JoinReply.FromString(
        self._call(lambda: self._join(req, timeout=self.limits.call_timeout_s, metadata=self._md()))
    )
    self.acked, self.generation = reply.next_seq, reply.generation
    peer = lambda p: crash_machine.Peer(p.steps, tuple(p.c_steps))
    return link_lib.Joined(
        tuple(reply.versions),
        tuple(peer(p) for p in reply.peers),
        peer(reply.previous) if reply.HasField("previous") else None,
        reply.silent_s,
        reply.generation,
    )

  def progress(self, finished: bool) -> bool:
    req = pb.ProgressRequest(
        learner=self.learner,
        session=self.session,
        steps=self.steps,
        tokens=self.tokens,
        step_time=self.step_time,
        finished=finished,
        **{k: v for k, v in self.report().items() if v is not None},
    )
    reply = pb.ProgressReply.FromString(
        self._call(
            lambda: self._progress(req, timeout=self.limits.call_timeout_s, metadata=self._md())
        )
    )
    self.generation, self.last_settled = reply.generation, reply.settled
    return reply.settled

  def upload(self, up: protocol.Upload) -> None:
    chunks = service.chunks(up, self.limits.chunk_bytes, learner=self.learner, session=self.session)
    self.step_time, self.steps, self.tokens = up.step_time, up.steps, up.tokens
    timeout = self.limits.deadline_s(up.nbytes)
    self._call(lambda: self._upload(chunks, timeout=timeout, metadata=self._md()))
    self.largest_upload = max(self.largest_upload, up.nbytes)
    self.codec_bytes_sent += up.nbytes

  def poll(self, wait_s: float) -> list[protocol.Send]:
    req = pb.PollRequest(
        learner=self.learner, session=self.session, after_seq=self.acked, wait_s=wait_s
    )

    def fetch():
      got, joiner, seq = [], None, None
      # (what a poll brings back is about what this learner uploads: merged fragments)
      timeout = wait_s + self.limits.deadline_s(self.largest_upload)
      for data in self._poll(req, timeout=timeout, metadata=self._md()):
        c = pb.Chunk.FromString(data)
        if c.index == 0:
          joiner, seq = (
              transport.Reassembler(self.limits.max_upload_bytes, self.limits.max_chunks),
              c.seq,
          )
        joiner.add(transport.Piece(c.index, c.total, c.length, c.crc, c.data))
        if c.index == c.total - 1:
          got.append((seq, transport.decode_message(joiner.done())))
      return got

    try:
      got = self._call(fetch)
    except transport.WireError as err:
      raise link_lib.Unreachable(f"corrupt delivery: {err}") from err
    if got:
      self.acked = got[-1][0]
    self.codec_bytes_received += sum(s.nbytes for _, s in got)
    return [s for _, s in got]

  def close(self) -> None:
    self.channel.close()
