"""A restarted learner process drives the crash-and-rejoin machine (rpc/learner_rejoin.py) from
its Join's answer, which the synchronizer host fills from the heartbeats (runtime/sync_host.py).
Numbers worked by hand; H = 10 throughout."""

import time

import numpy as np

from diloco.outer import fragments, optimizers, policies
from diloco.outer.outcomes import Code
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.recovery.crash_machine import Peer
from diloco.rpc import client as client_lib, learner_rejoin, service
from diloco.runtime import link as link_lib, sharded_link, sync_host
from diloco.runtime.link import Joined


class _Learner:
  """What the driver reads and moves of a learner (index, steps, versions, H)."""

  def __init__(self, steps: int, versions: list[int]):
    self.index, self.steps, self.versions = 1, steps, versions
    self.schedule = type("S", (), {"inner_steps": 10})()

  def resume_at(self, steps: int) -> None:
    self.steps = steps


def _driver(learner, lockstep=False, restart=True, restored=50, last=80):
  written, now = [], [90.0]
  rejoin = learner_rejoin.LearnerRejoin(
      learner, 2, lockstep, restart, restored, last, written.append, clock=lambda: now[0]
  )
  return rejoin, written, now


def test_a_restart_resumes_at_the_lead_peers_phase_and_rejoins_once_it_holds_the_answer():
  learner = _Learner(50, [3, 4, 3, 4])
  rejoin, written, now = _driver(learner)
  now[0] = 100.0
  # The earlier process last reported step 63, 2.5 s ago; peers at 57 and 44: the lead is at
  # 57, 7 steps into its H=10 period, so the restart (at 50) resumes at 50 + (57 - 50) % 10 = 57.
  answer = Joined((4, 4, 3, 4), (Peer(57, (3, 7, 1, 5)), Peer(44, (4, 4, 4, 4))), Peer(63, ()), 2.5)
  rejoin.joined(answer)
  assert learner.steps == 57
  (recover,) = written
  assert recover["event"] == "recover" and recover["resumes_at_step"] == 57
  assert recover["time"] == 97.5 and recover["back"] == 90.0  # (crashed 2.5 s before the Join)
  assert recover["restored_step"] == 50 and recover["steps_lost"] == 13  # 63 - 50
  assert [p["steps"] for p in recover["peers"]] == [57, 44] and recover["rejoined"] is None
  rejoin.received()  # it holds version 3 of fragment 0; the answer said 4
  assert len(written) == 1
  learner.versions[0] = 4
  now[0] = 101.5
  rejoin.received()
  assert written[1]["event"] == "rejoin" and written[1]["rejoined"] == 101.5
  assert written[1]["to_rejoin_s"] == 11.5  # from its start at 90
  assert rejoin.record["rejoined"] == 101.5 and rejoin.record["resumes_at_step"] == 57
  rejoin.joined(answer)  # a later Join (a resync): no second crash
  assert len(written) == 2 and learner.steps == 57


def test_where_lockstep_rounds_wait_it_redoes_them_from_the_leads_last_merge_point():
  learner = _Learner(50, [4, 4, 4, 4])
  rejoin, written, _ = _driver(learner, lockstep=True)
  # The lead at 57 last received a fragment 2 steps ago: its last merge point is 55 > 50.
  rejoin.joined(Joined((4, 4, 4, 4), (Peer(57, (7, 2, 9, 4)),), None))
  assert learner.steps == 55
  # Holding the answer already, it has rejoined at once; no earlier report: time and loss unknown.
  assert [w["event"] for w in written] == ["recover", "rejoin"]
  assert written[0]["time"] is None and written[0]["steps_lost"] is None


def test_the_counter_stays_where_the_rule_cannot_move_it():
  # A process that trained before its first Join (53, restored at 50) keeps its counter.
  learner = _Learner(50, [0, 0, 0, 0])
  rejoin, written, _ = _driver(learner)
  learner.steps = 53
  rejoin.joined(Joined((0, 0, 0, 0), (Peer(57, (1, 1, 1, 1)),), None))
  assert learner.steps == 53 and written[0]["peers"] == []
  # Near the end: 78 + (72 - 78) % 10 = 82, past the run's last step 80: it stops at 80.
  learner = _Learner(78, [0, 0, 0, 0])
  rejoin, written, _ = _driver(learner, restored=78)
  rejoin.joined(Joined((0, 0, 0, 0), (Peer(72, (1, 1, 1, 1)),), Peer(70, ()), 1.0))
  assert learner.steps == 80
  # Its last report (70) predates its save at 78: none lost, not -8.
  assert written[0]["steps_lost"] == 0
  # A learner that moves less than asked (a multi-process one, to a sync point) is recorded
  # where it is: 57 asked, 56 taken.
  learner = _Learner(48, [0, 0, 0, 0])
  learner.resume_at = lambda steps: setattr(learner, "steps", steps // 4 * 4)
  rejoin, written, _ = _driver(learner, restored=48)
  rejoin.joined(Joined((0, 0, 0, 0), (Peer(57, (1, 1, 1, 1)),), None))
  assert learner.steps == 56 and written[0]["resumes_at_step"] == 56


def test_a_first_start_records_nothing_and_a_shardless_answer_is_ignored():
  learner = _Learner(0, [-1, -1, -1, -1])
  rejoin, written, _ = _driver(learner, restart=False, restored=None)
  rejoin.joined(Joined((0, 0, 0, 0), (Peer(57, (1, 1, 1, 1)),), None))
  rejoin.received()
  assert learner.steps == 0 and written == [] and rejoin.record is None
  learner = _Learner(50, [0, 0, 0, 0])
  rejoin, written, _ = _driver(learner)
  rejoin.joined(None)  # (no shard answered: the next Join's answer decides)
  assert written == [] and rejoin.pending
  # An older synchronizer's answer has no versions: the rejoin is not known to be complete.
  rejoin.joined(Joined((), (), None))
  assert [w["event"] for w in written] == ["recover"] and rejoin.record["rejoined"] is None


def test_a_sharded_answer_takes_each_fragments_version_from_its_owner():
  """Fragments 0 and 2 on shard 0, 1 and 3 on shard 1. Shard 1 refuses this Join (its session
  not yet found absent): its fragments are not waited for, and the peers come from shard 0."""

  class Shard:

    def __init__(self, answer):
      self.answer = answer

    def join(self, versions, generations):
      if self.answer is None:
        raise link_lib.Refused(Code.ALREADY_EXISTS, "held by a live process")
      return self.answer

  held = type("H", (), {"versions": [1, 1, 1, 1], "generations": [0, 0, 0, 0]})()
  a0 = Joined((5, 9, 6, 9), (Peer(30, (2,)),), Peer(28, ()), 1.5)
  a1 = Joined((9, 7, 9, 8), (Peer(31, (3,)),), None)
  both = sharded_link.ShardedLink([Shard(a0), Shard(a1)], (0, 1, 0, 1), held, background=False)
  assert both.join((), ()) == Joined((5, 7, 6, 8), a0.peers, a0.previous, 1.5)
  one = sharded_link.ShardedLink([Shard(a0), Shard(None)], (0, 1, 0, 1), held, background=False)
  assert one.join((), ()) == Joined((5, 1, 6, 1), a0.peers, a0.previous, 1.5)


def _until(ready, timeout_s: float = 10.0) -> None:
  deadline = time.monotonic() + timeout_s
  while not ready():
    assert time.monotonic() < deadline, "the host's timer thread did not act in time"
    time.sleep(0.01)


def _sync() -> Synchronizer:
  params = {"embed": {"w": np.zeros(2, np.float32)}}
  policy = policies.Policy(
      policies.MinQuorum(1), policies.NoGrace(), policies.EqualWeights(), policies.Mean()
  )
  return Synchronizer(params, fragments.strided(params, 1), policy, optimizers.sgd(1.0))


def test_the_host_answers_a_join_with_the_versions_the_peers_and_the_earlier_process():
  sync = _sync()
  now = [0.0]
  host = sync_host.SyncHost(sync, absent_after_s=3.0, clock=lambda: now[0])
  try:
    _, _, first = host.join(0, "a", (0,))
    assert first == Joined((0,), (), None, 0.0)  # no peer yet, no earlier process
    host.join(1, "b", (0,))
    host.progress(0, "a", report={"step": 12, "c_steps": [2]})
    host.progress(1, "b", report={"step": 9})  # (no c_steps: not a peer to resume by)
    _, _, other = host.join(2, "c", (0,))
    assert other.peers == (Peer(12, (2,)),) and other.previous is None
    now[0] = 3.5
    host.progress(1, "b", report={"step": 15, "c_steps": [5]})
    now[0] = 4.0
    _until(lambda: 0 not in sync.live)  # the host's timer thread: silent for 4 s > 3 s, absent
    assert 1 in sync.live
    _, _, again = host.join(0, "a2", (0,))  # learner 0 restarted
    assert again.previous == Peer(12, (2,)) and again.silent_s == 4.0
    assert again.peers == (Peer(15, (5,)),)  # (learner 2 never reported)
    _, _, resync = host.join(1, "b", (0,))  # the same process joining again: no earlier one
    # Learner 0's report was its earlier process's: not a peer.
    assert resync.previous is None and resync.peers == () and resync.versions == (0,)
  finally:
    host.close()


def test_the_join_answer_crosses_the_wire():
  """The same answer through the gRPC service and client: the report's c_steps go up with a
  heartbeat, the peers, the earlier process and the synchronizer's generation come back in the
  JoinReply."""
  sync = _sync()
  now = [0.0]
  host = sync_host.SyncHost(sync, absent_after_s=3.0, clock=lambda: now[0])
  server, _, port = service.serve(host, "t", port=0)
  links = []

  def link(m: int) -> client_lib.GrpcLink:
    links.append(client_lib.GrpcLink(f"127.0.0.1:{port}", m, "t"))
    return links[-1]

  try:
    a = link(0)
    a.report = lambda: dict(total_steps=12, c_steps=[2])
    assert a.join((0,), ()) == Joined((0,), (), None, 0.0, generation=0)
    a.progress(False)
    assert link(1).join((0,), ()) == Joined((0,), (Peer(12, (2,)),), None, 0.0, generation=0)
    now[0] = 4.0
    _until(lambda: 0 not in sync.live)  # learner 0's process is found absent (silent 4 s)
    assert link(0).join((0,), ()) == Joined((0,), (), Peer(12, (2,)), 4.0, generation=0)
  finally:
    for l in links:
      l.close()
    server.stop(0).wait()
    host.close()
