"""A link that keeps the network off a learner's training thread (for non-blocking learners).

`BackgroundLink` wraps any `runtime.link.Link` (gRPC or in-process). A poller thread long-polls for
merged fragments while the learner is joined and buffers them, so `poll` returns what has arrived
without a round trip per step. Joins and heartbeats pass through as they are.

Uploads take one of two paths:
- `send_in_thread=False` (what experiments.learner uses for Decoupled learners): on the caller's
  thread, as with the plain link. The learner loop sends them while its next step computes
  (learner_loop._LearnerLoop.train), and the round trip still bounds how far a learner whose steps
  are shorter than it runs ahead of the synchronizer.
- `send_in_thread=True` (experimental; scripts/bench_wire.py --link=background): a sender thread
  empties a queue in order. Four tiny-model Decoupled learners on a 2-core host, with steps
  shorter than an upload's round trip, diverged with it: they stay in phase, upload each fragment
  from the same base version, and with K=1 and a grace window shorter than the synchronizer's
  check each upload merges alone (staleness 0, 1, 2, 3 in equal numbers), so the merged step is
  the sum of four outer gradients rather than their mean (BENCHMARKS.md; measured before
  staleness damping, which `mode=decoupled` now has for that case).

With the sender thread, at most `max_outstanding` uploads are queued or being sent (default one).
A heartbeat that reports the learner finished first waits until every queued upload is sent, so
the synchronizer hears of all of them before it settles the run. A refused upload cannot be raised
to the caller any more: it is counted in `refused` and its fragment is handed out by
`take_refused`, so the learner loop stops waiting for an answer to it. A failure to reach the
synchronizer, in either thread, is raised by the next call, so the learner loop re-joins with
backoff as it would with the plain link. Blocking learners (synchronous modes) do not use this
link: they wait for an answer to every upload anyway.
"""

import collections
import threading

from diloco.outer import protocol
from diloco.runtime import link as link_lib


class BackgroundLink:
  """`inner` with polls (and optionally uploads) in background threads (see the module doc)."""

  def __init__(
      self, inner, poll_wait_s: float = 0.5, max_outstanding: int = 1, send_in_thread: bool = True
  ):
    if max_outstanding < 1:
      raise ValueError(f"max_outstanding must be >= 1, got {max_outstanding}")
    self.inner, self.poll_wait_s, self.max_outstanding = inner, poll_wait_s, max_outstanding
    self.send_in_thread = send_in_thread
    self._sending = None  # the upload the sender thread has out, if any
    self._cond = threading.Condition()
    self._inner_lock = threading.Lock()  # join and poll share the inner link's sequence
    self._uploads: collections.deque = collections.deque()
    self._arrived: list[protocol.Send] = []
    self._error: link_lib.Unreachable | None = None
    self._joined = self._closed = False
    self.refused = 0
    self._refused_fragments: list[int] = []
    self._threads = [threading.Thread(target=self._poll_loop, daemon=True, name="poller")]
    if send_in_thread:
      self._threads.append(threading.Thread(target=self._send_loop, daemon=True, name="uploader"))
    for t in self._threads:
      t.start()

  def __getattr__(self, name):  # byte counters and the like of the inner link
    return getattr(self.inner, name)

  def _raise_error(self) -> None:
    with self._cond:
      err, self._error = self._error, None
    if err is not None:
      raise err

  def _failed(self, err: link_lib.Unreachable) -> None:
    with self._cond:
      self._error, self._joined = err, False
      self._uploads.clear()  # the synchronizer forgets them; the loop re-joins
      self._cond.notify_all()

  def join(self, versions, generations) -> link_lib.Joined | None:
    with self._cond:
      self._error, self._joined = None, False
    with self._inner_lock:
      joined = self.inner.join(versions, generations)
    with self._cond:
      self._joined = True
      self._cond.notify_all()
    return joined

  def progress(self, finished: bool) -> bool:
    self._raise_error()
    if finished:  # the synchronizer must have every upload before it hears "finished"
      with self._cond:
        self._cond.wait_for(
            lambda: not (self._uploads or self._sending) or self._error or self._closed
        )
      self._raise_error()
    return self.inner.progress(finished)

  def upload(self, up: protocol.Upload) -> None:
    self._raise_error()
    if not self.send_in_thread:  # the caller's thread, as the plain link: it raises Refused
      return self.inner.upload(up)
    with self._cond:
      self._cond.wait_for(
          lambda: self._outstanding() < self.max_outstanding or self._error or self._closed
      )
    self._raise_error()
    with self._cond:
      self._uploads.append(up)
      self._cond.notify_all()

  def poll(self, wait_s: float) -> list[protocol.Send]:
    self._raise_error()
    with self._cond:
      if not self._arrived and wait_s > 0:
        self._cond.wait_for(lambda: self._arrived or self._error or self._closed, wait_s)
      got, self._arrived = self._arrived, []
    self._raise_error()
    return got

  def take_refused(self) -> list[int]:
    """The fragments of uploads refused since the last call (no answer will come for them),
    with those the inner link hands back (a sharded link's down shards)."""
    with self._cond:
      got, self._refused_fragments = self._refused_fragments, []
    take = getattr(self.inner, "take_refused", None)
    return got + (take() if take is not None else [])

  def pending_uploads(self) -> int:
    with self._cond:
      return self._outstanding()

  def _outstanding(self) -> int:  # under self._cond
    return len(self._uploads) + (self._sending is not None)

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()
    for t in self._threads:
      t.join(timeout=self.poll_wait_s + 5.0)
    close = getattr(self.inner, "close", None)
    if close is not None:
      close()

  def _wait_until(self, ready) -> bool:
    """Waits until `ready()` (under the lock) or the link closes; False once closed."""
    with self._cond:
      self._cond.wait_for(lambda: ready() or self._closed)
      return not self._closed

  def _next_upload(self) -> protocol.Upload | None:
    """Takes the next queued upload as the one being sent; None once the link closes."""
    with self._cond:
      self._cond.wait_for(lambda: self._uploads or self._closed)
      if self._closed:
        return None
      up = self._sending = self._uploads.popleft()
      self._cond.notify_all()  # room in the queue
      return up

  def _send_loop(self) -> None:
    while (up := self._next_upload()) is not None:
      try:
        self.inner.upload(up)
      except link_lib.Refused:
        with self._cond:
          self.refused += 1
          self._refused_fragments.append(up.fragment)
      except link_lib.Unreachable as err:
        self._failed(err)
      except Exception as err:  # noqa: BLE001 - a dead sender thread would hang the learner
        self._failed(link_lib.Unreachable(f"upload failed: {err!r}"))
      with self._cond:
        self._sending = None
        self._cond.notify_all()  # a finished heartbeat may be waiting for this

  def _poll_loop(self) -> None:
    while self._wait_until(lambda: self._joined):
      try:
        with self._inner_lock:
          got = self.inner.poll(self.poll_wait_s)
      except link_lib.Unreachable as err:
        self._failed(err)
        continue
      except link_lib.Refused as err:  # e.g. not joined any more: the loop re-joins
        self._failed(link_lib.Unreachable(str(err)))
        continue
      if got:
        with self._cond:
          self._arrived.extend(got)
          self._cond.notify_all()
