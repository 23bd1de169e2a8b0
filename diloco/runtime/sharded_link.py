"""A learner's links to S synchronizer shards, as one `Link` (`outer.sync_shards`).

Each fragment's uploads go to the shard that owns it (`ownership.py`) and its merged versions
come from it; a Join and every heartbeat go to every shard. A shard that cannot be reached holds
back only its own fragments: the link marks it down and keeps serving the others, so the learner
keeps training and syncing them. The down shard's fragments are handed back as unanswered
(`take_refused`: the learner's machine stops waiting for them, so a blocking learner does not
wait for a dead shard either, and the next scheduled upload carries the progress), as is every
upload of them while it is down; the shard is joined again, with the versions the learner then
holds, once its backoff has passed, and its fragments are handed back once more then (a
restarted shard forgot what it was sent). Only when no shard can be reached does a call raise
`Unreachable` (the learner loop then backs off and joins every shard again).

Each shard's link polls in its own thread (`async_link.BackgroundLink`), so `poll` waits on what
has arrived from any shard without a round trip per shard.
"""

import threading
import time
from collections.abc import Callable, Sequence

from diloco.outer import protocol
from diloco.runtime import async_link, link as link_lib

POLL_SLICE_S = 0.01  # how often `poll` looks at the shards' buffers while it waits


class ShardedLink:
  """Links to every shard (index s: shard s), routed by `owner_of` (see the module doc)."""

  def __init__(
      self,
      links: Sequence[link_lib.Link],
      owner_of: Sequence[int],
      held,
      *,
      background: bool = True,
      max_backoff_s: float = 4.0,
      clock: Callable[[], float] = time.monotonic,
  ):
    self.owner_of, self.held, self.clock = tuple(owner_of), held, clock
    if max(self.owner_of) + 1 != len(links):
      raise ValueError(f"{len(links)} shard links for {max(self.owner_of) + 1} shards")
    wrap = (lambda l: async_link.BackgroundLink(l, send_in_thread=False)) if background else None
    self.links = [wrap(l) if wrap else l for l in links]
    self.max_backoff_s = max_backoff_s
    n = len(links)
    self.up = [False] * n  # joined and answering
    self.retry_at, self.backoff = [0.0] * n, [0.1] * n
    self.downs = [0] * n  # times each shard was found down (for the summary)
    self.joined_once = False
    self.joined_versions = None  # (what a single host's faulty link reports; not for shards)
    self.answers: list[link_lib.Joined | None] = [None] * n  # each shard's last Join answer
    self._unsent: list[int] = []
    self._lock = threading.Lock()  # the loop's thread and its heartbeat thread both call

  # ---- shards up and down ----

  def _fragments_of(self, s: int) -> list[int]:
    return [p for p, o in enumerate(self.owner_of) if o == s]

  def _down(self, s: int) -> None:
    """Shard s stopped answering: nothing it was sent will be answered (its fragments are
    handed back, so even a blocking learner trains on), and it is tried again after a backoff."""
    if self.up[s]:
      self.downs[s] += 1
      self._unsent += self._fragments_of(s)
    self.up[s] = False
    self.retry_at[s] = self.clock() + self.backoff[s]
    self.backoff[s] = min(2 * self.backoff[s], self.max_backoff_s)

  def _join(self, s: int) -> bool:
    try:
      self.answers[s] = self.links[s].join(tuple(self.held.versions), tuple(self.held.generations))
    except (link_lib.Unreachable, link_lib.Refused):
      self._down(s)
      return False
    self.up[s], self.backoff[s] = True, 0.1
    return True

  def _revive(self) -> None:
    """Joins again every down shard whose backoff has passed; a shard back forgot what was
    sent to it, so its fragments' unanswered uploads are handed back."""
    for s in range(len(self.links)):
      if self.joined_once and not self.up[s] and self.clock() >= self.retry_at[s] and self._join(s):
        self._unsent += self._fragments_of(s)

  def _any_up(self) -> None:
    if not any(self.up):
      raise link_lib.Unreachable("no synchronizer shard can be reached")

  # ---- the Link ----

  def join(self, versions, generations) -> link_lib.Joined | None:
    """Joins every shard; their answers as one: the peers and the earlier process from the
    first shard that answered, each fragment's version from its owner, or the version the
    learner holds where its owner did not answer (a rejoin does not wait for that shard)."""
    del versions, generations  # read from the learner when each shard is joined
    with self._lock:
      self.joined_once = True
      self.answers = [None] * len(self.links)
      held = tuple(self.held.versions)
      for s in range(len(self.links)):
        self._join(s)
      self._any_up()
      n = len(self.owner_of)
      answers = [a if a is not None and len(a.versions) == n else None for a in self.answers]
      first = next((a for a in self.answers if a is not None), None)
      if first is None:
        return None
      versions = tuple(
          held[p] if answers[o] is None else answers[o].versions[p]
          for p, o in enumerate(self.owner_of)
      )
      return link_lib.Joined(versions, first.peers, first.previous, first.silent_s)

  def upload(self, up: protocol.Upload) -> None:
    with self._lock:
      self._revive()
      s = self.owner_of[up.fragment]
      if not self.up[s]:
        self._unsent.append(up.fragment)
        return
      try:
        self.links[s].upload(up)  # a Refused goes to the caller, as with one synchronizer
      except link_lib.Unreachable:
        self._down(s)
        self._unsent.append(up.fragment)

  def poll(self, wait_s: float) -> list[protocol.Send]:
    deadline = self.clock() + wait_s
    while True:
      got: list[protocol.Send] = []
      with self._lock:
        self._revive()
        for s in range(len(self.links)):
          if self.up[s]:
            try:
              got += self.links[s].poll(0.0)
            except (link_lib.Unreachable, link_lib.Refused):
              self._down(s)
        self._any_up()
      if got or self.clock() >= deadline:
        return got
      time.sleep(min(POLL_SLICE_S, max(deadline - self.clock(), 0.0)))

  def progress(self, finished: bool) -> bool:
    with self._lock:
      self._revive()
      settled = all(self.up)
      for s in range(len(self.links)):
        if self.up[s]:
          try:
            settled &= self.links[s].progress(finished)
          except (link_lib.Unreachable, link_lib.Refused):
            self._down(s)
            settled = False
      self._any_up()
      return settled

  def take_refused(self) -> list[int]:
    """Fragments whose uploads will not be answered: refused in a poller thread, not sent to a
    down shard, or sent to a shard that has come back since."""
    with self._lock:
      got, self._unsent = self._unsent, []
      for l in self.links:
        take = getattr(l, "take_refused", None)
        got += take() if take is not None else []
      return got

  def close(self) -> None:
    for l in self.links:
      l.close()

  def _total(self, name: str) -> int:
    return sum(getattr(l, name, 0) for l in self.links)

  bytes_sent = property(lambda self: self._total("bytes_sent"))
  bytes_received = property(lambda self: self._total("bytes_received"))
  codec_bytes_sent = property(lambda self: self._total("codec_bytes_sent"))
  codec_bytes_received = property(lambda self: self._total("codec_bytes_received"))
