"""The real-time learner loop's reaction to what a poll delivers, and to a synchronizer that is
away; the synchronizer host's order of a merge's checkpoint and its delivery (no network)."""

import dataclasses
import random
import threading
import time

import numpy as np
import pytest

from configs import shakespeare
from diloco.chaos import schedule
from diloco.outer import fragments, optimizers, policies, protocol
from diloco.outer.outcomes import Code
from diloco.outer.codecs import compression
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.recovery import sync_checkpoint
from diloco.rpc import sync_main, transport
from diloco.runtime import learner_loop, sync_host


class _Learner:
  """Holds version 0 of four fragments (what the loop's machine reads) and records receipts."""

  def __init__(self):
    self.versions, self.generations, self.c_steps = [0] * 4, [0] * 4, [0] * 4
    self.sync_generation, self.steps, self.received = 0, 0, []

  def heard_generation(self, p):
    return self.sync_generation

  def receive(self, send, rebase=False):
    self.received.append(send)
    if send.own is not None and getattr(self, "delivery", "replace") == "rebase":
      self.c_steps[send.fragment] -= send.own[2]  # the merged upload's steps leave the counter


UPDATE = compression.encode_tree({"w": np.ones(2, np.float32)}, "fp32")


def _send(version, corrupt=False):
  """An update of fragment 3 to `version` (the learner holds version 0)."""
  send = protocol.Send(0, 3, version, update=UPDATE)
  return dataclasses.replace(send, checksum=send.checksum + 1) if corrupt else send


class _Link:

  def __init__(self, sends):
    self.sends = sends

  def poll(self, wait_s):
    return self.sends


class _JoinLink(_Link):
  """Answers a Join with `sends` (queued before the Join returns, as the host does), once."""

  def __init__(self, sends):
    super().__init__(sends)
    self.uploaded = []

  def join(self, versions, generations):
    pass

  def poll(self, wait_s):
    sends, self.sends = self.sends, []
    return sends

  def upload(self, up):
    self.uploaded.append(up.fragment)


@pytest.mark.parametrize(
    "delivery, trained_after, sent_again",
    [("rebase", 0, []), ("rebase", 3, [3]), ("replace", 0, [3])],
)
def test_a_rebasing_learner_reads_the_joins_answer_before_it_sends_again(
    delivery, trained_after, sent_again
):
  # Its upload of fragment 3 on version 0 (8 steps) is unanswered; it holds version 1 (another
  # learner's merge, kept on top under rebase), and trained `trained_after` steps since. The
  # synchronizer merged the upload into version 2 and restarted before sending it. The Join's
  # answer, version 2, names the upload: under rebase it is read first and answers the upload;
  # only the steps trained after it go again (a copy of all on version 1 is no duplicate of the
  # base-0 upload: it would be merged, its 8 steps twice; and a learner that finished while
  # away would never send those later steps). Under replace the copy goes first, as before (an
  # arrival would overwrite its progress).
  learner = _Learner()
  steps = 8 + trained_after
  learner.delivery, learner.versions, learner.c_steps = delivery, [1] * 4, [steps] * 4
  learner.upload = lambda p, **_: protocol.Upload(
      0, p, 1, {}, learner.c_steps[p], 64, 0.0, time.monotonic(), 0.0
  )
  own = protocol.Send(0, 3, 2, values={"w": np.zeros(2, np.float32)}, own=(0, 0, 8))
  link = _JoinLink([own])
  loop = learner_loop._LearnerLoop(
      learner, link, threading.Event(), heartbeat_s=1.0, max_backoff_s=1.0, rng=random.Random(0)
  )
  loop.machine.inflight[3] = 8
  assert loop.ensure_joined()
  assert link.uploaded == sent_again
  loop.deliver(0.0)
  # Unanswered after: only the rebasing learner's later steps (under replace the answer came
  # after the copy, and answers it).
  assert learner.received == [own] and (3 in loop.machine.inflight) == (trained_after > 0)


def test_a_rebasing_learner_rejoining_sends_its_pending_upload_as_it_was():
  # Its upload of fragment 3 on version 1 (8 steps) is pending; another learner's merge, version
  # 2, arrived since (kept on top under rebase), then a refusal made it join again. The Join
  # sends the pending upload as it was, on version 1 with a new time: a copy computed afresh on
  # version 2 would be no duplicate, and the synchronizer merged the upload since (a gRPC run
  # counted those 62 steps twice that way). Under replace version 2 would have answered it.
  learner = _Learner()
  learner.delivery, learner.versions, learner.c_steps = "rebase", [2] * 4, [8] * 4
  pending = protocol.Upload(0, 3, 1, {}, 8, 64, 0.0, 5.0, 0.0)
  learner.sent_again = lambda p, now: dataclasses.replace(pending, sent_time=now)
  learner.upload = lambda p, **_: pytest.fail("computed afresh")
  link = _JoinLink([])
  link.upload = lambda up: link.uploaded.append(up)
  loop = learner_loop._LearnerLoop(
      learner, link, threading.Event(), heartbeat_s=1.0, max_backoff_s=1.0, rng=random.Random(0)
  )
  loop.machine.inflight[3] = 8
  assert loop.ensure_joined()
  (again,) = link.uploaded
  assert (again.base_version, again.steps) == (1, 8) and again.sent_time > 5.0


@pytest.mark.parametrize(
    "send, applied, dropped, joined",
    [
        (_send(1), 1, 0, True),  # applied, still joined
        (_send(0), 0, 1, True),  # a duplicate: dropped, nothing lost
        (_send(2), 0, 0, False),  # a gap, version 1 was missed: join again to be sent it
        (_send(1, corrupt=True), 0, 1, False),  # corrupted on the way: dropped, asked for again
    ],
)
def test_deliver_rejoins_after_a_lost_or_corrupted_send(send, applied, dropped, joined):
  loop = learner_loop._LearnerLoop(
      _Learner(),
      _Link([send]),
      threading.Event(),
      heartbeat_s=1.0,
      max_backoff_s=1.0,
      rng=random.Random(0),
  )
  loop.joined = True
  loop.machine.inflight[3] = 7
  loop.deliver(0.0)
  assert (loop.applied, loop.dropped, loop.joined) == (applied, dropped, joined)
  assert (3 in loop.machine.inflight) == (applied == 0)


class _Trainer:
  """Steps instantly; fragment 0 is due after every step."""

  def __init__(self):
    self.steps, self.versions, self.uploads = 0, [0], 0

  def step(self, batch):
    self.steps += 1
    return {}

  def due(self):
    return [0]

  def upload(self, p, **kwargs):
    self.uploads += 1
    return ("upload", p, self.steps)


class _RecordingLink:

  def __init__(self):
    self.sent = []

  def join(self, versions, generations):
    pass

  def poll(self, wait_s):
    return []

  def upload(self, up):
    self.sent.append(up)


def test_a_non_blocking_learner_waits_for_the_answer_before_sending_a_fragment_again():
  """A second delta against the same base would carry the first one's progress again."""
  link = _RecordingLink()
  loop = learner_loop._LearnerLoop(
      _Trainer(), link, threading.Event(), heartbeat_s=1.0, max_backoff_s=1.0, rng=random.Random(0)
  )
  loop.learner.generations = [0]
  loop.train(lambda: None, steps=4, overlap=0, blocking=False, on_step=None)
  assert link.sent == [("upload", 0, 1)] and loop.machine.inflight == {0: 1}  # 2-4: unanswered
  loop.machine.inflight.clear()  # the merged fragment arrived
  loop.train(lambda: None, steps=6, overlap=0, blocking=False, on_step=None)
  assert link.sent == [("upload", 0, 1), ("upload", 0, 5)]


class _BeatLink(_RecordingLink):
  """Records what each heartbeat says; the synchronizer never settles."""

  def __init__(self):
    super().__init__()
    self.beats = []

  def progress(self, finished):
    self.beats.append(finished)
    return False


def test_heartbeats_after_the_last_step_say_finished():
  """The heartbeat thread's beat (finished=False) came after the settling loop's finished=True
  and the status page showed a finished learner as training; once trained, every beat says so,
  but for a beat while an upload is unanswered: its merge may come after the others were told
  the run is settled and left (a gRPC chaos run ended with one learner a version behind)."""
  link = _BeatLink()
  loop = learner_loop._LearnerLoop(
      _Trainer(), link, threading.Event(), heartbeat_s=1.0, max_backoff_s=1.0, rng=random.Random(0)
  )
  loop.learner.generations = [0]
  loop.joined = True
  loop.beat()  # a beat while training
  loop.train(lambda: None, steps=2, overlap=0, blocking=False, on_step=None)
  assert loop.machine.inflight  # its last uploads, unanswered: not finished yet (below)
  loop.beat(finished=True)
  loop.machine.inflight.clear()  # (their merges arrived)
  loop.beat()  # the heartbeat thread's beat after the last step
  loop.beat(finished=True)  # the settling loop's
  loop.beat()
  assert link.beats == [False, False, True, True, True]
  stopped = learner_loop._LearnerLoop(
      _Trainer(), _BeatLink(), threading.Event(), 1.0, 1.0, random.Random(0)
  )
  stopped.stop.set()  # stopped before its last step: not finished
  stopped.train(lambda: None, steps=2, overlap=0, blocking=False, on_step=None)
  stopped.beat()
  assert stopped.link.beats == [False]
  # Told to leave after its first step (SIGUSR1 in a learner process): it trains no further and
  # is finished as if its steps were done, its upload of that step answered first.
  left = learner_loop._LearnerLoop(_Trainer(), _BeatLink(), threading.Event(), 1.0, 1.0,
                                   random.Random(0))  # fmt: skip
  left.learner.generations, left.joined = [0], True
  left.train(lambda: None, steps=5, overlap=0, blocking=False,
             on_step=lambda lrn, _: left.leave.set())  # fmt: skip
  assert left.learner.steps == 1 and left.trained
  left.beat()
  left.machine.inflight.clear()
  left.beat()
  assert left.link.beats == [False, True]


class _Holder:
  """One fragment, due after every step; counts progress like a Learner (no JAX)."""

  def __init__(self, link):
    self.link, self.index = link, 0
    self.versions, self.generations, self.c_steps, self.steps = [0], [0], [0], 0

  def heard_generation(self, p):
    return 0

  def step(self, batch):
    self.steps += 1
    self.c_steps[0] += 1
    self.link.down = self.link.down or self.steps == 3  # it dies once step 1's upload went
    return {}

  def due(self):
    return [0]

  def upload(self, p, sent_time, **kwargs):
    return ("upload", p, self.c_steps[p])


class _DownLink(_BeatLink):
  """A synchronizer that is away while `down` (every call unreachable), never settling."""

  def __init__(self):
    super().__init__()
    self.down = False

  def _check(self):
    if self.down:
      raise learner_loop.Unreachable("synchronizer down")

  def join(self, versions, generations):
    self._check()

  def upload(self, up):
    self._check()
    super().upload(up)

  def progress(self, finished):
    self._check()
    return super().progress(finished)

  def poll(self, wait_s):
    self._check()
    return super().poll(wait_s)


def _away_loop():
  link = _DownLink()
  loop = learner_loop._LearnerLoop(
      _Holder(link), link, threading.Event(), heartbeat_s=1.0, max_backoff_s=0.01,
      rng=random.Random(0),
  )  # fmt: skip
  loop.train(lambda: None, steps=6, overlap=0, blocking=False, on_step=None)
  return link, loop


def test_what_a_learner_trained_while_the_synchronizer_was_away_goes_at_the_next_join():
  """Issue 49, point 3: the upload after step 1 was never answered (the synchronizer died) and
  steps 3-6 ran after it died (4-6 unjoined: the poll before step 4 found it gone). Before, the Join to the restarted synchronizer cleared the unanswered
  upload and nothing more fell due: those 6 steps were never sent."""
  link, loop = _away_loop()
  assert link.sent == [("upload", 0, 1)] and loop.unreachable_steps == 3
  assert loop.machine.undelivered() == {0: 6}
  link.down = False  # back
  assert not loop.settle(timeout_s=0.3)  # (this synchronizer never settles)
  assert link.sent == [("upload", 0, 1), ("upload", 0, 6)]  # all of it, at the Join


def test_a_learner_whose_synchronizer_stays_away_says_what_it_did_not_deliver():
  link, loop = _away_loop()
  assert not loop.settle(timeout_s=0.3)
  assert link.sent == [("upload", 0, 1)] and loop.machine.undelivered() == {0: 6}


def _one_fragment_host(on_checkpoint=lambda s: None) -> sync_host.SyncHost:
  params = {"embed": {"w": np.zeros(2, np.float32)}}
  policy = policies.Policy(
      policies.MinQuorum(1), policies.NoGrace(), policies.EqualWeights(), policies.Mean()
  )
  sync = Synchronizer(params, fragments.strided(params, 1), policy, optimizers.sgd(1.0),
                      checkpoint_every=1)  # fmt: skip
  return sync_host.SyncHost(sync, on_checkpoint=on_checkpoint)


def _upload(host: sync_host.SyncHost, version: int) -> int:
  delta = compression.encode_tree({"embed/w": np.ones(2, np.float32)}, "fp32")
  up = protocol.Upload(0, 0, version, delta, steps=3, tokens=24, time=0.0, sent_time=0.0,
                       step_time=0.1)  # fmt: skip
  return host.upload(0, "s0", up)


def test_a_poll_is_answered_while_a_save_is_in_flight(tmp_path):
  """Issue 72: the gRPC synchronizer saves off its host's lock (sync_checkpoint.BackgroundSaves).
  Here orbax's write of the save after merge 1 is held until learner 1's poll has returned that
  merge; the save then completes with the state of merge 1."""
  config = shakespeare.get_config("mode=decoupled,runlocal")
  assert sync_main.make_synchronizer(config).checkpoint_every == 1  # (the config says 0)
  ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path))
  writing, release = threading.Event(), threading.Event()
  write = ckpt._writer.save  # pylint: disable=protected-access

  def held_write(*args, **kwargs):
    writing.set()
    assert release.wait(60), "the test never released the write"
    return write(*args, **kwargs)

  ckpt._writer.save = held_write  # pylint: disable=protected-access
  host = _one_fragment_host()
  sync = host.sync
  saves = sync_checkpoint.BackgroundSaves(
      ckpt, host.cond, lambda: (sync.merges, sync.state_dict()), share=1.0
  )
  host.on_checkpoint = lambda s: saves.request()
  try:
    for m in (0, 1):
      host.join(m, f"s{m}", (0,))
    assert _upload(host, 0) == 1
    assert writing.wait(60)  # the save of merge 1 is in orbax's hands, and held there
    digest = sync.digest()
    sends = host.poll(1, "s1", 0, 30.0)
    assert [s.version for _, s in sends] == [1]
    assert saves.in_flight_since is not None and saves.saves == 0
  finally:
    release.set()
    saves.close()
    host.close()
  assert saves.saves == 1 and ckpt.latest_step() == 1
  fresh = _one_fragment_host().sync
  fresh.load_state_dict(ckpt.restore(fresh.state_dict()))
  assert fresh.digest() == digest


class _TimedSaves:
  """A checkpointer whose save takes `took` seconds of a fake clock; records (merges, start)."""

  def __init__(self, clock: list[float], took: float):
    self.clock, self.took, self.saved = clock, took, []

  def save(self, merges, state):
    self.saved.append((merges, self.clock[0]))
    self.clock[0] += self.took
    return True


def _asleep_after(saves, waits: int) -> None:
  """Returns once the save thread has gone to sleep more than `waits` times (an event)."""
  with saves._cv:  # pylint: disable=protected-access
    assert saves._cv.wait_for(lambda: saves.waits > waits, 60)  # pylint: disable=protected-access


def test_background_saves_take_at_most_their_share_of_the_time():
  """share 0.25 and a save of 2 s: the next save starts 8 s after the last one began (a request
  in between waits for it), so saving takes at most a quarter of the time."""
  clock, merges = [0.0], [0]
  ckpt = _TimedSaves(clock, took=2.0)
  saves = sync_checkpoint.BackgroundSaves(
      ckpt, threading.Lock(), lambda: (merges[0], {}), share=0.25, clock=lambda: clock[0]
  )
  try:
    _asleep_after(saves, 0)
    merges[0] = 3
    saves.request()  # t = 0: saved at once, until t = 2
    _asleep_after(saves, 1)
    assert ckpt.saved == [(3, 0.0)] and clock[0] == 2.0
    merges[0] = 5
    waits = saves.waits
    saves.request()  # t = 2: not before t = 0 + 2 / 0.25 = 8
    _asleep_after(saves, waits)
    clock[0] = 7.5
    waits = saves.waits
    saves.request()
    _asleep_after(saves, waits)
    assert ckpt.saved == [(3, 0.0)]
    merges[0] = 9
    clock[0] = 8.0
    waits = saves.waits
    saves.request()  # due: the snapshot is taken now, with the merges since
    _asleep_after(saves, waits)
    assert ckpt.saved == [(3, 0.0), (9, 8.0)] and saves.saves == 2 and saves.seconds == 4.0
  finally:
    saves.close()


def _quorum_host(k: int) -> sync_host.SyncHost:
  """A host over one two-float fragment merging by the mean at quorum `k`, nobody found absent."""
  params = {"embed": {"w": np.zeros(2, np.float32)}}
  policy = policies.Policy(
      policies.MinQuorum(k), policies.NoGrace(), policies.EqualWeights(), policies.Mean()
  )
  sync = Synchronizer(params, fragments.strided(params, 1), policy, optimizers.sgd(1.0))
  return sync_host.SyncHost(sync, absent_after_s=60.0)


def test_a_learner_told_settled_is_not_waited_for_by_a_later_merge():
  """test_learner_process.py's restart (synchronous saves and asynchronous alike, one run in
  four on a loaded machine): learner 1, finished, polled a merge that called for an upload of
  its; learner 0's beat in between was told settled and it exited. Learner 1's upload merged,
  its send waited for learner 0 to poll it, and learner 1 was not settled until learner 0 was
  found absent, after its own deliver timeout. A learner told settled is no longer waited for,
  until it beats or uploads again."""
  host = _quorum_host(1)
  delta = compression.encode_tree({"embed/w": np.ones(2, np.float32)}, "fp32")
  up = lambda m, base: protocol.Upload(m, 0, base, delta, steps=3, tokens=24, time=0.0,
                                       sent_time=0.0, step_time=0.1)  # fmt: skip
  try:
    for m in (0, 1):
      host.join(m, f"s{m}", (0,))
    assert host.upload(0, "s0", up(0, 0)) == 1
    for m in (0, 1):  # each takes the merge (and acknowledges it)
      assert [s.version for _, s in host.poll(m, f"s{m}", 0, 0.0)] == [1]
      assert host.poll(m, f"s{m}", 1, 0.0) == []
    assert not host.progress(1, "s1", finished=True)  # (learner 0 has not finished)
    assert host.progress(0, "s0", finished=True)  # learner 0 exits
    assert host.upload(1, "s1", up(1, 1)) == 1  # learner 1's late upload: merged
    assert [s.version for _, s in host.poll(1, "s1", 1, 0.0)] == [2]
    assert host.poll(1, "s1", 2, 0.0) == []
    assert host.progress(1, "s1", finished=True)  # before: False until learner 0 was absent
    assert host.progress(0, "s0", finished=True) is False  # back: its send waits for it again
  finally:
    host.close()


class _RebaseLink(_JoinLink):
  """Delivers version 2 of fragment 0 (which merged the learner's upload on version 1, refused
  as a duplicate when sent again) at the first poll, then answers each upload with a merge."""

  def __init__(self):
    super().__init__([protocol.Send(0, 0, 2, update=UPDATE)])
    self.sent = []

  def upload(self, up):
    self.sent.append(up)
    self.sends.append(protocol.Send(0, 0, 2 + len(self.sent), update=UPDATE))


class _BlockingTrainer(_Trainer):
  """At step 11 holding version 1 of fragment 0, one step past its upload of it (refused as a
  duplicate when it was sent again: its merge, version 2, had not arrived)."""

  def __init__(self):
    super().__init__()
    self.steps, self.versions, self.generations, self.c_steps = 11, [1], [0], [1]
    self.index, self.received = 0, []

  def due(self):
    return [0] if self.steps % 10 == 0 else []

  def heard_generation(self, p):
    return 0

  def receive(self, send, rebase=False):
    self.received.append((send.version, rebase))
    self.versions[0] = send.version
    if not rebase:
      self.c_steps[0] = 0

  def upload(self, p, **kwargs):
    self.uploads += 1
    return protocol.Upload(0, p, self.versions[p], {}, self.c_steps[p], 64, 0.0, 0.0, 0.0)

  def not_merged(self, p, sent_time):
    pass


def test_a_blocking_learner_sends_a_rebases_progress_while_it_waits():
  """The merge of its upload arrives while it waits: applied as a rebase, the step trained after
  the upload goes again, and the machine waits for its answer. It must go while the learner waits
  (a threads run under load deadlocked: the learner waited for the answer of an upload it held
  back to its next step, and the lockstep round, whose quorum counts every member, waited for
  that upload)."""
  trainer, link = _BlockingTrainer(), _RebaseLink()
  loop = learner_loop._LearnerLoop(
      trainer, link, threading.Event(), heartbeat_s=0.05, max_backoff_s=1.0, rng=random.Random(0)
  )
  loop.joins = 1  # (the refusal made it join again: version 2 answers that Join)
  loop.machine.merged_unseen.add(0)  # (its copy was refused as a duplicate of version 1)
  timer = threading.Timer(5.0, loop.stop.set)  # (before the fix: it waited for ever)
  timer.start()
  try:
    loop.train(lambda: None, steps=12, overlap=0, blocking=True, on_step=None)
  finally:
    timer.cancel()
  assert trainer.received[0] == (2, True)  # the merge of its upload, its later step kept
  assert [(u.base_version, u.steps) for u in link.sent][:1] == [(2, 1)]  # that step, sent again
  assert trainer.steps == 12 and not loop.stop.is_set()


def test_an_upload_refused_when_a_later_upload_merges_its_round_reaches_its_learners_poll():
  """Quorum 2: learner 0's upload (non-finite) is answered on arrival and waits; learner 1's
  upload merges the round, which refuses learner 0's. The refusal is learner 1's call's
  business only if it is its own: learner 0 finds it in its next poll, naming its upload by the
  sent time it gave it (7.5, not the host's), so its machine stops waiting for an answer
  (tests/test_threads_chaos.py: a poisoned upload under the period clock)."""
  host = _quorum_host(2)
  finite = compression.encode_tree({"embed/w": np.ones(2, np.float32)}, "fp32")
  nan = schedule.poison(finite, "nan", 1.0)  # (past the encoder's finite check, as a fault is)
  up = lambda m, delta: protocol.Upload(m, 0, 0, delta, steps=3, tokens=24, time=0.0,
                                        sent_time=7.5 + m, step_time=0.1)  # fmt: skip
  try:
    for m in (0, 1):
      host.join(m, f"s{m}", (0,))
    assert host.upload(0, "s0", up(0, nan)) == 0  # waits for the quorum
    assert host.upload(1, "s1", up(1, finite)) == 1  # merges, without learner 0's
    got = host.poll(0, "s0", 0, 0.0)
    assert [type(s).__name__ for _, s in got] == ["Refused", "Send"]
    refusal = got[0][1]
    assert (refusal.learner, refusal.fragment, refusal.sent_time) == (0, 0, 7.5)
    assert refusal.code is Code.NON_FINITE
    assert [type(s).__name__ for _, s in host.poll(1, "s1", 0, 0.0)] == ["Send"]  # (its own: none)
    # Through the wire as it is, code and all.
    assert transport.decode_message(transport.encode_message(refusal)) == refusal
  finally:
    host.close()
