"""Limits of the synchronizer service (message size, chunks, learners, rates, timeouts)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limits:
  max_message_bytes: int = 4 << 20  # one gRPC message (a chunk); gRPC's default limit is 4 MiB
  chunk_bytes: int = 1 << 20  # payload bytes per chunk
  max_upload_bytes: int = 1 << 30  # one reassembled upload or send
  max_chunks: int = 4096
  max_learners: int = 64
  progress_per_s: float = 50.0
  absent_after_s: float = 5.0  # a learner silent this long is left out of quorums
  call_timeout_s: float = 10.0  # deadline of a unary call; the floor of a transfer's
  poll_wait_s: float = 1.0  # long-poll wait; its deadline is this plus a transfer's
  keepalive_ms: int = 10_000  # ping an idle or silent connection this often; drop it unanswered
  link_floor_bytes_per_s: float = 1e6  # a transfer's deadline adds its bytes at this rate

  def deadline_s(self, nbytes: int) -> float:
    """The deadline of a call that moves `nbytes`: call_timeout_s plus the bytes at the floor
    rate, so an upload over a link slower than planned is late, not cut off and resent forever."""
    return self.call_timeout_s + nbytes / self.link_floor_bytes_per_s

  def __post_init__(self):
    if self.chunk_bytes + 1024 > self.max_message_bytes:
      raise ValueError(
          f"chunk_bytes={self.chunk_bytes} leaves no room for the chunk header "
          f"under max_message_bytes={self.max_message_bytes}"
      )
    if min(self.max_chunks, self.max_learners, self.max_upload_bytes) < 1:
      raise ValueError("limits must be positive")
    if (
        min(self.call_timeout_s, self.poll_wait_s, self.keepalive_ms, self.link_floor_bytes_per_s)
        <= 0
    ):
      raise ValueError("timeouts, keepalive and the link floor must be positive")

  @classmethod
  def from_deploy(cls, deploy) -> "Limits":
    """The limits a config's `deploy` section sets; the rest keep their defaults."""
    return cls(
        max_message_bytes=int(deploy.max_message_bytes),
        chunk_bytes=int(deploy.chunk_bytes),
        max_learners=int(deploy.max_learners),
        absent_after_s=float(deploy.absent_after_s),
        call_timeout_s=float(deploy.call_timeout_s),
        poll_wait_s=float(deploy.poll_wait_s),
        keepalive_ms=int(round(float(deploy.keepalive_s) * 1000)),
        link_floor_bytes_per_s=float(deploy.link_floor_mbit_s) * 1e6 / 8,
    )

  def channel_options(self) -> list[tuple[str, int]]:
    """gRPC's channel arguments. A lost connection is tried again at most a call's deadline
    apart, each attempt given as long (gRPC's own defaults: attempts up to 2 minutes apart, 20 s
    each), so a learner whose link comes back is answered again within about its own backoff
    and a call (docs/deployment.md)."""
    call_ms = int(round(self.call_timeout_s * 1000))
    return [
        ("grpc.max_send_message_length", self.max_message_bytes),
        ("grpc.max_receive_message_length", self.max_message_bytes),
        ("grpc.keepalive_time_ms", self.keepalive_ms),
        ("grpc.keepalive_timeout_ms", self.keepalive_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", min(1000, call_ms)),
        ("grpc.max_reconnect_backoff_ms", call_ms),
        ("grpc.min_reconnect_backoff_ms", call_ms),
    ]
