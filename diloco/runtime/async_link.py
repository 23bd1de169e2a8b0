"""A link that keeps the network off a learner's training thread (for non-blocking learners).

`BackgroundLink` wraps any `runtime.link.Link` (gRPC or in-process). A poller thread long-polls for
merged fragments while the learner is joined and buffers them, so `poll` returns what has arrived
without a round trip per step. Heartbeats pass through as they are; a Join may be made in a thread
too (`join_nowait`: what a gRPC learner does, so a synchronizer that is cut off or frozen costs it
no steps while each Join waits out its deadline).

Uploads take one of two paths:
- `send_in_thread=False` (each shard's link inside a gRPC learner's `sharded_link.ShardedLink`,
  whose own caller is a sender thread): on the caller's thread, as with the plain link. The learner loop sends them while its next step computes
  (learner_loop._LearnerLoop.train), and the round trip bounds how far a learner whose steps are
  shorter than it runs ahead of the synchronizer.
- `send_in_thread=True` (gRPC learners, rpc/learner_main.py): a sender thread empties a queue in
  order, so a slow or cut link delays the uploads, never the steps. What bounds the run-ahead then
  is the learner's machine: it decides no upload of a fragment whose last one is unanswered (its
  progress goes in the next one), so at most one upload per fragment is out. Four tiny-model
  Decoupled learners on a 2-core host, with steps shorter than an upload's round trip, once
  diverged with this path: they stayed in phase, uploaded each fragment from the same base
  version, and with K=1 each upload merged alone, so the merged step was the sum of four outer
  gradients rather than their mean (BENCHMARKS.md, "Four tiny learners on two cores"). That was
  before staleness damping, which `mode=decoupled` has for that case.

With the sender thread, at most `max_outstanding` uploads are queued or being sent (default one);
`upload` waits for room beyond that. A heartbeat that reports the learner finished first waits
until every queued upload is sent, so the synchronizer hears of all of them before it settles the
run. An upload the sender could not deliver cannot be raised to the caller any more: `take_returned`
hands it back with its refusal (`link.Refused`), or with None when it was still queued as the link
failed (never sent), for the learner loop to treat as the plain link's caller would. A failure to
reach the synchronizer, in any thread, is raised by the next call, so the learner loop re-joins
with backoff as it would with the plain link. Blocking learners (synchronous modes) do not use
this link: they wait for an answer to every upload anyway.
"""

import collections
import threading

from diloco.outer import protocol
from diloco.runtime import link as link_lib


class Joining:
  """What `join_nowait` returns while its Join is still on the wire."""

  def __repr__(self) -> str:
    return "JOINING"


JOINING = Joining()


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
    self._returned: list[tuple[protocol.Upload, link_lib.Refused | None]] = []
    self._join_call: dict | None = None  # join_nowait's Join: {done, answer | error}
    self._epoch = 0  # one per Join: a call of an earlier one failing later fails nothing
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

  def _failed(self, err: link_lib.Unreachable, epoch: int) -> None:
    """A call of Join `epoch`'s session failed: the loop must join again (nothing if a later
    Join was made meanwhile: that call's upload was sent again by it, afresh)."""
    with self._cond:
      if epoch != self._epoch:
        return
      self._error, self._joined = err, False
      self._drop_queue()
      self._cond.notify_all()

  def _drop_queue(self) -> None:  # under self._cond
    """Uploads never sent are handed back (the loop joins again, and its Join sends them again,
    afresh): none of them goes out in a later session as well."""
    self._returned += [(up, None) for up, _ in self._uploads]
    self._uploads.clear()

  def _new_session(self) -> None:  # under self._cond
    self._epoch += 1
    self._error, self._joined = None, False
    self._drop_queue()

  def join(self, versions, generations) -> link_lib.Joined | None:
    with self._cond:
      self._new_session()
    with self._inner_lock:
      joined = self.inner.join(versions, generations)
    with self._cond:
      self._joined = True
      self._cond.notify_all()
    return joined

  def join_nowait(self, versions, generations):
    """A Join made in a thread: starts one and returns JOINING, returns JOINING while it is on
    the wire, then its answer once (or raises its failure). Nothing is fetched or sent for the
    learner until it is answered."""
    with self._cond:
      call = self._join_call
      if call is None:
        self._new_session()
        self._join_call = {"done": False}
        args = (versions, generations, self._join_call)
        threading.Thread(target=self._join_in_thread, args=args, daemon=True, name="joiner").start()
        return JOINING
      if not call["done"]:
        return JOINING
      self._join_call = None
    if "error" in call:
      raise call["error"]
    return call["answer"]

  def _join_in_thread(self, versions, generations, call: dict) -> None:
    try:
      with self._inner_lock:
        answer = self.inner.join(versions, generations)
    except (link_lib.Unreachable, link_lib.Refused) as err:
      result = {"error": err}
    except Exception as err:  # noqa: BLE001 - the loop must hear of it, not wait forever
      result = {"error": link_lib.Unreachable(f"join failed: {err!r}")}
    else:
      result = {"answer": answer}
    with self._cond:
      call.update(result, done=True)
      self._joined = "answer" in result
      self._cond.notify_all()

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
      self._uploads.append((up, self._epoch))
      self._cond.notify_all()

  def poll(self, wait_s: float) -> list[protocol.Send]:
    self._raise_error()
    with self._cond:
      if not self._arrived and wait_s > 0:
        self._cond.wait_for(lambda: self._arrived or self._error or self._closed, wait_s)
      got, self._arrived = self._arrived, []
    self._raise_error()
    return got

  def take_returned(self) -> list[tuple[protocol.Upload, link_lib.Refused | None]]:
    """The sender thread's uploads since the last call that no answer will come for: each with
    its refusal, or None if it was never sent (see the module doc)."""
    with self._cond:
      got, self._returned = self._returned, []
    return got

  def take_refused(self) -> list[int]:
    """The fragments the inner link hands back (a sharded link's down shards)."""
    take = getattr(self.inner, "take_refused", None)
    return take() if take is not None else []

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

  def _next_upload(self) -> tuple[protocol.Upload, int] | None:
    """Takes the next queued upload (and its session) as the one being sent; None once the
    link closes."""
    with self._cond:
      self._cond.wait_for(lambda: self._uploads or self._closed)
      if self._closed:
        return None
      up, epoch = self._uploads.popleft()
      self._sending = up
      self._cond.notify_all()  # room in the queue
      return up, epoch

  def _send_loop(self) -> None:
    while (item := self._next_upload()) is not None:
      up, epoch = item
      try:
        self.inner.upload(up)
      except link_lib.Refused as err:  # (even of a replaced session: the learner's machine
        with self._cond:  # knows whether a later Join answered for it, `LearnerMachine.refused`)
          self.refused += 1
          self._returned.append((up, err))
      except link_lib.Unreachable as err:
        self._failed(err, epoch)
      except Exception as err:  # noqa: BLE001 - a dead sender thread would hang the learner
        self._failed(link_lib.Unreachable(f"upload failed: {err!r}"), epoch)
      with self._cond:
        self._sending = None
        self._cond.notify_all()  # a finished heartbeat may be waiting for this

  def _poll_loop(self) -> None:
    while self._wait_until(lambda: self._joined):
      with self._cond:
        epoch = self._epoch
      try:
        with self._inner_lock:
          got = self.inner.poll(self.poll_wait_s)
      except link_lib.Unreachable as err:
        self._failed(err, epoch)
        continue
      except link_lib.Refused as err:  # e.g. not joined any more: the loop re-joins
        self._failed(link_lib.Unreachable(str(err)), epoch)
        continue
      if got:
        with self._cond:
          self._arrived.extend(got)
          self._cond.notify_all()
