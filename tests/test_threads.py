"""Threads runtime: one thread per learner on its own sub-mesh, against the virtual runtime."""

import numpy as np
import pytest

from configs import shakespeare
from diloco.config import build
from diloco.outer import protocol
from diloco.runners import islands as islands_lib
from diloco.runtime import link as link_lib, sync_host, threads


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
  """The same synchronous config (K = all, blocking, tau = 0) on the virtual and threads runtimes."""
  config = shakespeare.get_config("mode=diloco,runlocal,steps=20")
  parts = build.local_learners(config)
  virtual = islands_lib.run(config, str(tmp_path_factory.mktemp("virtual")), parts=parts)
  return config, virtual, parts.syncs[0].global_params(), threads.train(config)


def test_threads_matches_virtual_bit_for_bit(both_runs):
  config, virtual, virtual_globals, (run, run_globals, learner_copies) = both_runs
  # 20 steps, H = 10: two merges, each learner does all 20 steps.
  assert run["merges"] == virtual["merges"] == 2
  assert [r["steps"] for r in run["per_learner"]] == [20, 20]
  # Where the work went (issue 51): the uploads after steps 10 and 20 carry 10 steps each, and
  # both merge, so every trained step reached a merge, on both runtimes.
  for summary in (run, virtual):
    assert [r["merged_share"] for r in summary["per_learner"]] == [1.0, 1.0]
    assert summary["merged_share"] == 1.0
  # The same learner decisions (learner_machine: uploads on which version after which step,
  # merges applied, rejoins), decided by one machine driven by two runtimes.
  assert [r["decisions"] for r in run["per_learner"]] == virtual["learner_decisions"]
  # Timing cannot matter here, so the global parameters are bit-identical (tolerance 0).
  assert threads.max_abs_diff(virtual_globals, run_globals) == 0.0
  for learner_copy in learner_copies:
    assert threads.max_abs_diff(run_globals, learner_copy) == 0.0
  assert all(r["settled"] for r in run["per_learner"])
  assert run["refusals"] == {}
  # Training moved the parameters away from their initial values.
  sync = threads.build_parts(config)[0].make_sync()
  assert threads.max_abs_diff(sync.global_params(), run_globals) > 1e-4


def test_threads_with_two_synchronizer_shards_match_one_bit_for_bit(both_runs):
  """Two shard hosts, each learner linked to both: the same merges and bits as one host."""
  config, virtual, virtual_globals, _ = both_runs
  sharded = config.copy_and_resolve_references()
  sharded.outer.fragments, sharded.outer.fragment_kind, sharded.outer.sync_shards = 2, "balanced", 2
  one = config.copy_and_resolve_references()
  one.outer.fragments, one.outer.fragment_kind = 2, "balanced"
  (run1, globals1, _), (run2, globals2, copies2) = threads.train(one), threads.train(sharded)
  assert run2["merges"] == run1["merges"] == 4  # two fragments merged twice
  assert [r["decisions"] for r in run2["per_learner"]] == [
      r["decisions"] for r in run1["per_learner"]
  ]
  assert threads.max_abs_diff(globals1, globals2) == 0.0
  assert all(threads.max_abs_diff(globals2, c) == 0.0 for c in copies2)


def test_split_devices_gives_disjoint_sub_meshes():
  import jax

  islands = build.split_devices(jax.devices(), 2)
  assert [len(d) for d in islands] == [4, 4]
  assert not set(islands[0]) & set(islands[1])


def test_max_abs_diff_checks_paths():
  with pytest.raises(ValueError, match="different paths"):
    threads.max_abs_diff({"a": np.zeros(1)}, {"b": np.zeros(1)})
  assert threads.max_abs_diff({"a": np.array([1.0, 2.0])}, {"a": np.array([1.5, 2.0])}) == 0.5


class _Clock:

  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


class _TwoFragmentSync:
  """Records the events a SyncHost feeds it; live/members as the real synchronizer keeps them."""

  class frag:
    num_fragments = 2

  def __init__(self):
    self.live, self.members, self.pending, self.generation, self.events = (
        set(),
        set(),
        [{}, {}],
        0,
        [],
    )
    self.versions = [0, 0]  # (what a Join is answered with)

  def handle(self, event):
    self.events.append(event)
    if isinstance(event, protocol.Join):
      self.live.add(event.learner)
      self.members.add(event.learner)
    elif isinstance(event, protocol.Leave):
      self.live.discard(event.learner)
    return []


def test_silent_learner_is_absent_until_it_rejoins():
  import time as time_lib

  clock, sync = _Clock(), _TwoFragmentSync()
  host = sync_host.SyncHost(sync, absent_after_s=2.0, clock=clock)
  try:
    host.join(0, "a", (0, 0))
    host.join(1, "b", (0, 0))
    clock.t = 1.5
    host.progress(0, "a")  # learner 0 heartbeats, learner 1 stays silent
    clock.t = 2.5
    deadline = time_lib.monotonic() + 5
    while sync.live != {0} and time_lib.monotonic() < deadline:
      time_lib.sleep(0.01)
    assert sync.live == {0}
    assert isinstance(sync.events[-1], protocol.Leave) and sync.events[-1].learner == 1
    assert sync.events[-1].time == 2.5 and host.counts["absent"] == 1
    with pytest.raises(link_lib.Refused, match="join again"):
      host.progress(1, "b")
    # Another process may take the id once it is absent; a live id is refused.
    with pytest.raises(link_lib.Refused, match="held by a live process"):
      host.join(0, "c", (0, 0))
    host.join(1, "c", (0, 0))
    assert sync.live == {0, 1}
  finally:
    host.close()


class _HeldMerge(_TwoFragmentSync):
  """An upload's handling (a merge, under the host's lock) waits for `release`."""

  def __init__(self):
    import threading

    super().__init__()
    self.merging, self.release = threading.Event(), threading.Event()

  def handle(self, event):
    if isinstance(event, protocol.Upload):
      self.merging.set()
      assert self.release.wait(30)
    return super().handle(event)


def test_a_learner_waiting_on_a_long_merge_is_not_silent():
  """The merge a learner's upload sets off holds the host's lock for 10 s (a first merge that
  compiles on a loaded machine held it for 5 s), while the other learner long-polls for its
  result: neither is absent at 10 s; the uploader's silence starts when its call ends and the
  poller's when its poll does."""
  import threading

  clock, sync = _Clock(), _HeldMerge()
  host = sync_host.SyncHost(sync, absent_after_s=2.0, clock=clock)
  got = {}
  up = protocol.Upload(1, 0, 0, {}, 10, 80, 0.0, 0.0, 1.0)
  uploader = threading.Thread(target=lambda: got.update(merges=host.upload(1, "b", up)))
  poller = threading.Thread(target=lambda: got.update(sends=host.poll(0, "a", 0, wait_s=60)))
  try:
    host.join(0, "a", (0, 0))
    host.join(1, "b", (0, 0))
    poller.start()
    uploader.start()
    assert sync.merging.wait(30)
    clock.t = 10.0
    sync.release.set()
    uploader.join(30)
    with host.cond:
      host.tick(10.0)
      assert sync.live == {0, 1} and "absent" not in host.counts
      host.tick(12.0)  # silent for exactly absent_after_s since the upload's answer: not yet
      assert sync.live == {0, 1}
      host.tick(12.5)  # learner 1 silent 2.5 s; learner 0 still in its poll
      assert sync.live == {0} and host.counts["absent"] == 1
      assert [e.learner for e in sync.events if isinstance(e, protocol.Leave)] == [1]
  finally:
    host.close()
  poller.join(30)
  assert got == {"merges": 0, "sends": []}


class _SlowLink:
  """A link whose uploads take `upload_s` and whose polls long-poll an outbox; a Join waits
  while `hold_join` is set and fails while `join_fails`; a failing upload fails once
  `release_upload` is set."""

  def __init__(self, upload_s: float):
    import threading

    self.upload_s, self.uploaded, self.outbox, self.joins = upload_s, [], [], 0
    self.fail_next_upload = self.refuse_next_upload = self.join_fails = False
    self.cond = threading.Condition()
    self.hold_join, self.release_join = threading.Event(), threading.Event()
    self.release_upload = threading.Event()  # what a failing upload waits for
    self.release_upload.set()

  def join(self, versions, generations):
    if self.hold_join.is_set():
      self.release_join.wait()
    if self.join_fails:
      raise link_lib.Unreachable("no route")
    self.joins += 1
    return ("joined", versions)

  def progress(self, finished):
    return False

  def upload(self, up):
    import time as time_lib

    time_lib.sleep(self.upload_s)
    if self.fail_next_upload:
      self.fail_next_upload = False
      self.release_upload.wait()
      raise link_lib.Unreachable("link down")
    if self.refuse_next_upload:
      self.refuse_next_upload = False
      raise link_lib.Refused("stale", "stale: base version 0")
    self.uploaded.append(up)

  def poll(self, wait_s):
    with self.cond:
      self.cond.wait_for(lambda: self.outbox, wait_s)
      got, self.outbox[:] = list(self.outbox), []
      return got


def test_background_link_keeps_uploads_and_polls_off_the_caller():
  import time as time_lib
  from diloco.runtime import async_link

  inner = _SlowLink(upload_s=0.2)
  link = async_link.BackgroundLink(inner, poll_wait_s=0.05, max_outstanding=2)
  try:
    link.join((0,), ())
    t0 = time_lib.monotonic()
    link.upload("u1")
    link.upload("u2")
    assert time_lib.monotonic() - t0 < 0.1  # queued, not sent by the caller
    deadline = time_lib.monotonic() + 5
    while link.pending_uploads() and time_lib.monotonic() < deadline:
      time_lib.sleep(0.01)
    assert inner.uploaded == ["u1", "u2"]  # in order
    with inner.cond:
      inner.outbox.append("s1")
      inner.cond.notify_all()
    assert link.poll(2.0) == ["s1"]  # fetched by the poller, handed over without a call
    assert link.poll(0.0) == []
    inner.fail_next_upload = True
    link.upload("u3")
    deadline = time_lib.monotonic() + 5
    while link.pending_uploads() and time_lib.monotonic() < deadline:
      time_lib.sleep(0.01)
    with pytest.raises(link_lib.Unreachable, match="link down"):
      link.poll(0.0)  # the sender's failure is raised by the next call
    link.join((0,), ())
    assert inner.joins == 2 and link.poll(0.0) == []
  finally:
    link.close()


def test_background_link_bounds_its_queue_and_flushes_before_finished():
  import collections
  import time as time_lib
  from diloco.runtime import async_link

  inner = _SlowLink(upload_s=0.2)
  link = async_link.BackgroundLink(inner, poll_wait_s=0.05)  # one upload outstanding
  up = collections.namedtuple("Up", "fragment")
  try:
    link.join((0,), ())
    t0 = time_lib.monotonic()
    link.upload(up(0))  # the sender takes it at once
    assert time_lib.monotonic() - t0 < 0.1
    link.upload(up(1))  # no room until u0 is sent, at 0.2 s
    assert time_lib.monotonic() - t0 >= 0.2 - 0.01
    assert inner.uploaded == [up(0)]
    inner.refuse_next_upload = True  # u1 is refused: its fragment is handed out once
    link.upload(up(2))
    link.progress(finished=True)  # returns only once every queued upload has gone out
    assert inner.uploaded == [up(0), up(2)] and link.pending_uploads() == 0
    # Handed back once, with its refusal, for the loop to treat as a refused send.
    (back, err), *more = link.take_returned()
    assert link.refused == 1 and back == up(1) and err.code == "stale" and not more
    assert link.take_returned() == []
    with pytest.raises(ValueError, match="max_outstanding"):
      async_link.BackgroundLink(inner, max_outstanding=0)
  finally:
    link.close()


def test_background_link_joins_in_a_thread_and_hands_back_what_it_never_sent():
  import collections
  from diloco.runtime import async_link

  inner = _SlowLink(upload_s=0.0)
  link = async_link.BackgroundLink(inner, poll_wait_s=0.05, max_outstanding=3)
  up = collections.namedtuple("Up", "fragment")
  try:
    inner.hold_join.set()  # a Join on the wire: the caller is answered JOINING, never held
    assert link.join_nowait((0,), ()) is async_link.JOINING
    assert link.join_nowait((0,), ()) is async_link.JOINING  # (the same Join: not a second)
    inner.release_join.set()
    answer = async_link.JOINING
    while answer is async_link.JOINING:
      answer = link.join_nowait((0,), ())
    assert answer == ("joined", (0,)) and inner.joins == 1
    inner.hold_join.clear()
    inner.join_fails = True  # a failed Join is raised once, to the caller that asks next
    assert link.join_nowait((1,), ()) is async_link.JOINING
    with pytest.raises(link_lib.Unreachable, match="no route"):
      while link.join_nowait((1,), ()) is async_link.JOINING:
        pass
    # The sender fails on u0 while u1 and u2 wait behind it: those two were never sent and
    # come back with no refusal (the next Join sends them again); u0 may have arrived.
    inner.fail_next_upload = True
    inner.release_upload.clear()
    link.upload(up(0))
    link.upload(up(1))
    link.upload(up(2))
    inner.release_upload.set()
    with link._cond:
      link._cond.wait_for(lambda: link._error is not None, 5.0)
    assert link.take_returned() == [(up(1), None), (up(2), None)] and inner.uploaded == []
    # An upload of a session a later Join replaced fails after that Join: the new session goes
    # on (its Join sent that progress again, afresh); before, the learner joined once more.
    with pytest.raises(link_lib.Unreachable):
      link.poll(0.0)
    inner.join_fails, inner.fail_next_upload = False, True
    inner.release_upload.clear()
    assert link.join_nowait((2,), ()) is async_link.JOINING
    while link.join_nowait((2,), ()) is async_link.JOINING:
      pass
    link.upload(up(3))  # (its sender takes it, then waits to fail)
    with link._cond:
      link._cond.wait_for(lambda: link._sending is not None, 5.0)
    assert link.join_nowait((3,), ()) is async_link.JOINING  # a later Join while it is out
    while link.join_nowait((3,), ()) is async_link.JOINING:
      pass
    inner.release_upload.set()
    with link._cond:
      link._cond.wait_for(lambda: link._sending is None, 5.0)
    assert link.poll(0.0) == [] and link.take_returned() == []  # (no failure raised)
  finally:
    link.close()
