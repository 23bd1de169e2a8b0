"""A fault schedule (diloco/chaos/schedule.py) applied in real time to a threads-runtime learner's link.

`FaultClock` maps schedule seconds to wall seconds: a fault at t acts `scale * t` wall seconds
after the run's start (durations and delays scale alike). `HostSlot` holds the synchronizer host
of the moment (None while it is down after a crash). `FaultyLink` wraps a learner's
`InProcessLink` and does to its messages what the faults active now say:

- synchronizer down: every call fails as unreachable (the learner trains on and re-joins later);
- partition drop: every call fails as unreachable; uploads are lost (their progress stays in the
  learner's counters and goes with its next upload), sends wait in the host's outbox;
- partition hold: nothing crosses the link; uploads and the sends fetched afterwards cross at the
  end of the window; joins fail as unreachable; heartbeats do not reach the host (so a long hold
  gets the learner marked absent, as a real one would);
- delay +d: an upload reaches the host d later (a delivery thread carries it: the learner does not
  wait), a send fetched now reaches the learner d later, joins and heartbeats take d longer;
- corrupt and poison: the next message carries them (they stay armed across a crash of the
  learner).

What each fault does to a message is the run's fault layer's (chaos/faults.py, shared with the
virtual runtime and the gRPC learner process); this module does the waiting and the threads.
"""

import heapq
import math
import threading
import time
from collections.abc import Callable

import numpy as np

from diloco.chaos import faults as fault_layer, schedule as chaos
from diloco.chaos.stats import ChaosStats, PoisonFates
from diloco.outer import protocol
from diloco.runtime import link as link_lib, sync_host


class FaultClock:
  """Schedule time <-> wall time of one run (schedule seconds x `scale` = wall seconds); no
  fault is active before `start()`."""

  def __init__(
      self,
      faults: list[chaos.Fault],
      scale: float = 1.0,
      clock: Callable[[], float] = time.monotonic,
  ):
    if not (math.isfinite(scale) and scale > 0):
      raise ValueError(f"the chaos time scale (wall s per schedule s) must be > 0, got {scale}")
    self.layer = fault_layer.FaultLayer(faults)  # corrupt and poison act once their time comes
    self.faults, self.scale, self.clock = self.layer.faults, float(scale), clock
    self.t0: float | None = None

  def start(self) -> None:
    self.t0 = self.clock()

  def now(self) -> float:
    """Schedule seconds since the start (-inf before it)."""
    return -math.inf if self.t0 is None else (self.clock() - self.t0) / self.scale

  def wall(self, t: float) -> float:
    """The clock reading at schedule time t."""
    return self.t0 + t * self.scale


class HostSlot:
  """The synchronizer host in service (None while it is down), and its incarnation number."""

  def __init__(self, host: sync_host.SyncHost):
    self._lock = threading.Lock()
    self.host, self.incarnation = host, 0

  def get(self) -> tuple[sync_host.SyncHost | None, int]:
    with self._lock:
      return self.host, self.incarnation

  def take_down(self) -> sync_host.SyncHost | None:
    """Marks the host down; returns the one that was up (None if it was down already)."""
    with self._lock:
      host, self.host = self.host, None
      return host

  def put(self, host: sync_host.SyncHost) -> None:
    with self._lock:
      self.host, self.incarnation = host, self.incarnation + 1


class Shared:
  """What the links and the driver of one run share: counters under a lock, the bit-flip rng."""

  def __init__(self, learners: int, seed: int):
    self.lock = threading.Lock()
    self.stats = ChaosStats(steps_lost=[0] * learners)
    self.rng = np.random.default_rng([seed, 0xC4A05])
    self.poisoned = PoisonFates(self.stats)  # poisoned uploads in a round, to their fate

  def fault(self, f: chaos.Fault) -> None:
    with self.lock:
      self.stats.faults[f.kind] += 1

  def fate(self, kind: str, outcome: str) -> None:
    with self.lock:
      self.stats.fate(kind, outcome)

  def dropped(self, direction: str) -> None:
    with self.lock:
      self.stats.dropped[direction] += 1


class FaultyLink:
  """Learner m's link under a fault schedule (see the module doc); a `link_lib.Link`."""

  def __init__(
      self,
      slot: HostSlot,
      learner: int,
      clock: FaultClock,
      shared: Shared,
      make_inner: Callable[[sync_host.SyncHost, int], object],
  ):
    self.slot, self.learner, self.clock, self.shared = slot, learner, clock, shared
    self.make_inner = make_inner
    self.inner, self._incarnation = None, -1
    self.joined_versions: list[int] | None = None  # the host's versions at the last join
    self._cond = threading.Condition()
    self._down: list[tuple[float, protocol.Send]] = []  # fetched sends, until they arrive
    self._up: list[tuple[float, int, protocol.Upload, object]] = []  # uploads on their way
    self._seq = 0
    self._tainted: dict[int, str] = {}  # id(upload) -> taint kind, until it reaches the host
    self._closed = False
    self._courier = threading.Thread(
        target=self._deliver_uploads, daemon=True, name=f"courier{learner}"
    )
    self._courier.start()

  # ---- what is active now ----

  def _link(self):
    host, incarnation = self.slot.get()
    if host is None:
      raise link_lib.Unreachable("the synchronizer is down")
    if incarnation != self._incarnation or self.inner is None:
      self.inner, self._incarnation = self.make_inner(host, self.learner), incarnation
    return self.inner

  def _partition(self, mode: str) -> float | None:
    """Wall time the active partition of this mode ends, or None."""
    end = self.clock.layer.partition_end(self.learner, self.clock.now(), mode)
    return None if end is None else self.clock.wall(end)

  def _arrival(self) -> float:
    """Wall time a message sent now arrives (delays and a holding partition)."""
    delay = self.clock.layer.delay(self.learner, self.clock.now())
    arrival = self.clock.clock() + delay * self.clock.scale
    held = self._partition("hold")
    return arrival if held is None else max(arrival, held)

  def _check_drop(self, direction: str) -> None:
    if self._partition("drop") is not None:
      self.shared.dropped(direction)
      raise link_lib.Unreachable(f"learner {self.learner}'s link is partitioned")

  # ---- the Link calls ----

  def new_session(self) -> None:
    """The learner process restarted: a new session; sends on their way to it are lost."""
    with self._cond:
      self.inner, self._incarnation, self.joined_versions = None, -1, None
      self._down.clear()

  def join(self, versions, generations) -> link_lib.Joined | None:
    self._check_drop("up")
    if self._partition("hold") is not None:
      raise link_lib.Unreachable(f"learner {self.learner}'s link holds every message")
    self._wait_until(self._arrival())
    link = self._link()
    joined = link.join(versions, generations)
    self._joined(link)
    return joined

  def _joined(self, link) -> None:
    """After a join: the host's versions then (what the driver's rejoin check compares)."""
    with link.host.cond:
      self.joined_versions = list(link.host.sync.versions)

  def progress(self, finished: bool) -> bool:
    self._check_drop("up")
    if self._partition("hold") is not None:
      return False  # the heartbeat never reaches the host
    self._wait_until(self._arrival())
    return self._link().progress(finished)

  def upload(self, up: protocol.Upload) -> None:
    self._check_drop("up")
    link = self._link()
    up = self._taint_up(up)
    arrival = self._arrival()
    if arrival <= self.clock.clock():
      return self._hand_over(link, up)
    with self._cond:
      self._seq += 1
      heapq.heappush(self._up, (arrival, self._seq, up, link))
      self._cond.notify_all()

  def poll(self, wait_s: float) -> list[protocol.Send]:
    ready = self._arrived()
    if ready:
      return ready
    self._check_drop("down")
    held = self._partition("hold")
    if held is not None:
      self._wait_until(min(held, self.clock.clock() + wait_s))
      return self._arrived()
    got = self._link().poll(wait_s)
    arrival = self._arrival()
    with self._cond:
      self._down.extend((arrival, s) for s in got)
    return self._arrived()

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()
    self._courier.join(timeout=2.0)

  # ---- delivery ----

  def _arrived(self) -> list[protocol.Send]:
    now = self.clock.clock()
    with self._cond:
      n = 0
      while n < len(self._down) and self._down[n][0] <= now:  # in order: no overtaking
        n += 1
      ready = [s for _, s in self._down[:n]]
      del self._down[:n]
    return [self._taint_down(s) for s in ready]

  def _wait_until(self, wall: float) -> None:
    with self._cond:
      while not self._closed and (left := wall - self.clock.clock()) > 0:
        self._cond.wait(left)

  def _deliver_uploads(self) -> None:
    with self._cond:
      while not self._closed:
        if not self._up or self._up[0][0] > self.clock.clock():
          self._cond.wait(None if not self._up else self._up[0][0] - self.clock.clock())
          continue
        _, _, up, link = heapq.heappop(self._up)
        self._cond.release()
        try:
          self._hand_over(link, up)
        except (link_lib.Refused, link_lib.Unreachable):
          pass  # counted by the host, or lost with a synchronizer that is gone
        finally:
          self._cond.acquire()

  def _gone(self, link) -> bool:
    """Whether the host `link` was made for is gone (restarted or down)."""
    host, _ = self.slot.get()
    return host is not link.host

  def _hand_over(self, link, up: protocol.Upload) -> None:
    """The upload reaches the host (the one it was sent to, which may be gone by now)."""
    with self._cond:
      kind = self._tainted.pop(id(up), None)
    if self._gone(link):
      self.shared.dropped("up")
      if kind is not None:
        self.shared.fate(kind, "lost")
      raise link_lib.Unreachable("the synchronizer this upload was sent to is gone")
    try:
      link.upload(up)
    except link_lib.Refused as err:
      if kind is not None:
        self.shared.fate(kind, f"rejected ({err.code})")
      raise
    if kind is not None and kind.startswith("poison"):  # its fate is decided at the merge
      with self.shared.lock:
        self.shared.poisoned.entered(up, kind)

  # ---- taints ----

  def _taint_up(self, up: protocol.Upload) -> protocol.Upload:
    with self.shared.lock:  # the layer's armed faults and the rng are the run's
      bad, f = self.clock.layer.taint_up(up, self.clock.now(), self.shared.rng)
    if f is None:
      return up
    self.shared.fault(f)
    kind = fault_layer.taint_name(f)
    with self._cond:
      self._tainted[id(bad)] = kind  # followed to its fate by _hand_over
    self.shared.fate(kind, "sent")
    return bad

  def _taint_down(self, send: protocol.Send) -> protocol.Send:
    if not isinstance(send, protocol.Send):
      return send  # (a late refusal: no fragment to corrupt)
    with self.shared.lock:
      bad, f = self.clock.layer.taint_down(send, self.clock.now(), self.shared.rng)
    if f is None:
      return send
    self.shared.fault(f)
    self.shared.fate("corrupt_down", "sent")
    # Learner.accepts checks the checksum first: this is the fate it meets there.
    self.shared.fate("corrupt_down", "applied" if bad.checksum_ok() else "refused (checksum)")
    return bad
