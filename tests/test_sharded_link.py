"""A learner's link to two synchronizer shards, against fake shard links (no network)."""

import dataclasses

import pytest

from diloco.outer import protocol
from diloco.runtime import link as link_lib
from diloco.runtime.sharded_link import ShardedLink

OWNER_OF = (0, 1, 0, 1)  # fragments 0, 2 on shard 0; 1, 3 on shard 1


class FakeShard:
  """A shard's link: records calls; `down` makes every call fail as an unreachable host."""

  def __init__(self):
    self.down, self.joins, self.uploads, self.queue = False, [], [], []

  def _check(self):
    if self.down:
      raise link_lib.Unreachable("down")

  def join(self, versions, generations):
    self._check()
    self.joins.append((versions, generations))

  def upload(self, up):
    self._check()
    self.uploads.append(up.fragment)

  def poll(self, wait_s):
    self._check()
    got, self.queue = self.queue, []
    return got

  def progress(self, finished):
    self._check()
    return finished


@dataclasses.dataclass
class Held:
  versions: list = dataclasses.field(default_factory=lambda: [3, 1, 3, 1])
  generations: list = dataclasses.field(default_factory=lambda: [0, 0, 0, 0])


class Clock:

  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


def _up(p):
  return protocol.Upload(0, p, 0, {}, 1, 1, 0.0, 0.0, 1.0)


def test_a_down_shard_holds_back_only_its_own_fragments():
  shards, clock, held = [FakeShard(), FakeShard()], Clock(), Held()
  link = ShardedLink(shards, OWNER_OF, held, background=False, clock=clock)
  link.join((), ())
  assert [len(s.joins) for s in shards] == [1, 1] and link.up == [True, True]
  link.upload(_up(0))
  link.upload(_up(3))
  assert (shards[0].uploads, shards[1].uploads) == ([0], [3])

  shards[1].down = True  # killed
  link.upload(_up(1))  # found down: its fragments (3 unanswered) and this upload handed back
  assert link.up == [True, False] and link.downs == [0, 1] and link.take_refused() == [1, 3, 1]
  link.upload(_up(2))  # shard 0 still takes its fragments
  link.upload(_up(3))  # not sent: shard 1 is down (backoff 0.1 s not passed)
  assert shards[0].uploads == [0, 2] and link.take_refused() == [3]
  shards[0].queue = ["merged 2"]
  assert link.poll(0.0) == ["merged 2"]
  assert link.progress(True) is False  # not settled while a shard is down

  shards[1].down = False  # restarted
  held.versions = [4, 1, 4, 1]
  clock.t = 0.05
  link.upload(_up(2))
  assert len(shards[1].joins) == 1  # its backoff has not passed yet
  clock.t = 0.2
  assert link.progress(True) is True  # joined again first, with the versions held now
  assert shards[1].joins[-1] == ((4, 1, 4, 1), (0, 0, 0, 0))
  # What it sent before is forgotten by the restarted shard: its fragments are handed back.
  assert link.take_refused() == [1, 3]

  shards[0].down = shards[1].down = True
  with pytest.raises(link_lib.Unreachable, match="no synchronizer shard"):
    link.poll(0.0)


def test_a_link_per_shard_is_required():
  with pytest.raises(ValueError, match="1 shard links for 2 shards"):
    ShardedLink([FakeShard()], OWNER_OF, Held(), background=False)
