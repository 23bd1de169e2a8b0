"""The real-time learner loop's reaction to what a poll delivers (no JAX, no network)."""

import dataclasses
import random
import threading

import numpy as np
import pytest

from diloco.outer import compression, protocol
from diloco.runtime import learner_loop


class _Learner:
  """Holds version 0 of four fragments (what the loop's machine reads) and records receipts."""

  def __init__(self):
    self.versions, self.generations, self.c_steps = [0] * 4, [0] * 4, [0] * 4
    self.sync_generation, self.steps, self.received = 0, 0, []

  def heard_generation(self, p):
    return self.sync_generation

  def receive(self, send):
    self.received.append(send)


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
  and the status page showed a finished learner as training; once trained, every beat says so."""
  link = _BeatLink()
  loop = learner_loop._LearnerLoop(
      _Trainer(), link, threading.Event(), heartbeat_s=1.0, max_backoff_s=1.0, rng=random.Random(0)
  )
  loop.learner.generations = [0]
  loop.joined = True
  loop.beat()  # a beat while training
  loop.train(lambda: None, steps=2, overlap=0, blocking=False, on_step=None)
  loop.beat()  # the heartbeat thread's beat after the last step
  loop.beat(finished=True)  # the settling loop's
  loop.beat()
  assert link.beats == [False, True, True, True]
  stopped = learner_loop._LearnerLoop(
      _Trainer(), _BeatLink(), threading.Event(), 1.0, 1.0, random.Random(0)
  )
  stopped.stop.set()  # stopped before its last step: not finished
  stopped.train(lambda: None, steps=2, overlap=0, blocking=False, on_step=None)
  stopped.beat()
  assert stopped.link.beats == [False]
