"""The learner's protocol machine (outer/learner/learner_machine.py): hand-worked sequences, then random
event sequences (hypothesis) against three properties the runtimes rely on.

The machine holds no arrays, so a plain record stands in for the learner: per fragment the
(generation, version) held and the steps since it was received.
"""

import dataclasses

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from diloco.outer import fragments, optimizers, policies
from diloco.outer.codecs import compression
from diloco.outer.learner import learner_machine as lm
from diloco.outer.outcomes import Code
from diloco.outer.protocol import Join, Leave, Log, Refused, Send, Upload
from diloco.outer.sync.synchronizer import Synchronizer

P = 2  # fragments
VALUES = {"w": np.zeros(2, np.float32)}
UPDATE = compression.encode_tree({"w": np.ones(2, np.float32)}, "fp32")


@dataclasses.dataclass
class Held:
  versions: list = dataclasses.field(default_factory=lambda: [0] * P)
  generations: list = dataclasses.field(default_factory=lambda: [0] * P)
  sync_generation: int = 0
  c_steps: list = dataclasses.field(default_factory=lambda: [0] * P)
  steps: int = 0
  delivery: str = "replace"

  def heard_generation(self, p):
    del p  # one synchronizer
    return self.sync_generation

  def step(self):
    self.steps += 1
    self.c_steps = [c + 1 for c in self.c_steps]

  def apply(self, send: Send):
    p = send.fragment
    self.versions[p], self.generations[p] = send.version, send.generation
    self.sync_generation = max(self.sync_generation, send.generation)
    self.c_steps[p] = 0


def _update(p, version, base_gen=0, gen=0, corrupt=False, own=False):
  send = Send(
      0,
      p,
      version,
      update=UPDATE,
      generation=gen,
      base_generation=base_gen,
      own=(0, version - 1, 1) if own else None,
  )
  return dataclasses.replace(send, checksum=send.checksum + 1) if corrupt else send


def _values(p, version, gen=0):
  return Send(0, p, version, values=VALUES, generation=gen)


def _refused(p, code, sent, base=(0, 0)):
  return Refused(0, p, code, "", sent, sent, base[1], base[0])


def test_verdicts_by_hand():
  held = Held(versions=[3, 0], generations=[1, 1], sync_generation=1)
  assert lm.verdict(_update(0, 4, base_gen=1, gen=1), held, P) is None  # 3 -> 4
  assert lm.verdict(_update(0, 3, base_gen=1, gen=1), held, P) is Code.DUPLICATE  # held already
  assert lm.verdict(_update(0, 5, base_gen=1, gen=1), held, P) is Code.GAP  # 4 was lost
  assert lm.verdict(_update(0, 4, base_gen=1, gen=1, corrupt=True), held, P) is Code.CHECKSUM
  assert lm.verdict(_update(0, 4, base_gen=0, gen=0), held, P) is Code.OLD_GENERATION
  assert lm.verdict(_values(0, 2, gen=2), held, P) is None  # a newer generation's history
  assert lm.verdict(_values(0, 3, gen=1), held, P) is Code.DUPLICATE


def test_a_due_fragment_whose_upload_is_unanswered_is_not_sent_again():
  """The rule the virtual runtime broke: H=1, the merge of step 1's upload arrives after step 2."""
  held = Held()
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  held.step()
  assert machine.stepped([0]) == [lm.Upload(0)] and machine.inflight == {0: 1}
  held.step()
  assert machine.stepped([0]) == [] and machine.skipped == 1  # 2 steps go with the next upload
  assert machine.arrived(_update(0, 1)) == [lm.Apply(_update(0, 1))]
  held.apply(_update(0, 1))
  held.step()
  assert machine.stepped([0]) == [lm.Upload(0)] and machine.inflight == {0: 3}


@pytest.mark.parametrize("delivery", ["rebase", "at_own_sync"])
def test_under_the_keeping_rules_only_its_own_merge_answers_an_upload(delivery):
  """Issue 51: another learner's merge does not answer learner 0's upload (it is still pending
  at the synchronizer), so the next due upload of that fragment waits; its own merge does."""
  held = Held(delivery=delivery)
  machine = lm.LearnerMachine(held, P, blocking=True, overlap=1)
  held.step()
  assert machine.stepped([0]) == [lm.Upload(0)]
  assert machine.arrived(_update(0, 1)) == [lm.Apply(_update(0, 1))]
  held.apply(_update(0, 1))
  held.step()
  assert machine.inflight == {0: 1} and machine.blocked()  # (blocking: it waits for its own)
  assert machine.stepped([0]) == [] and machine.skipped == 1
  own = _update(0, 2, own=True)
  assert machine.arrived(own) == [lm.Apply(own)] and machine.inflight == {}


def test_blocking_waits_tau_steps_for_the_answer():
  held = Held()
  machine = lm.LearnerMachine(held, P, blocking=True, overlap=1)
  held.step()
  machine.stepped([1])
  assert not machine.blocked()  # step 2 may start: tau = 1
  held.step()
  assert machine.blocked()  # step 3 may not
  machine.arrived(_update(1, 1))
  assert not machine.blocked()


def test_refusals_by_code():
  held = Held(c_steps=[5, 5], steps=5)
  machine = lm.LearnerMachine(held, P, blocking=True, overlap=0)
  machine.stepped([0, 1])
  machine.join_sent(1.0)
  # A base refused before the learner's last Join: that Join reported the versions already.
  assert machine.refused(_refused(0, Code.STALE, sent=0.5)) == []
  assert machine.refused(_refused(1, Code.STALE, sent=2.0)) == []  # a Join is in flight
  machine.join_answered(set())
  machine.stepped([0, 1])
  assert machine.refused(_refused(0, Code.UNKNOWN_BASE_VERSION, sent=3.0)) == [lm.Rejoin("refused")]
  assert machine.refused(_refused(1, Code.CHECKSUM, sent=3.0)) == [lm.Resend(1, (0, 0))]
  assert machine.inflight == {}  # nothing answers a refused upload
  assert machine.resend_due(1, (0, 0), now=4.0) == [lm.Upload(1)] and machine.inflight == {1: 5}
  # The resend is refused too: not sent a third time; the next scheduled upload carries it.
  assert machine.refused(_refused(1, Code.CHECKSUM, sent=4.0)) == []
  # Received another version meanwhile: that round is over, no resend.
  machine.stepped([0])
  machine.refused(_refused(0, Code.CHECKSUM, sent=5.0))
  held.apply(_update(0, 1))
  assert machine.resend_due(0, (0, 0), now=6.0) == [] and 0 not in machine.inflight
  assert machine.refused(_refused(0, Code.NO_PROGRESS, sent=7.0)) == []


def test_a_restored_learner_trains_once_its_join_is_answered_in_full():
  held = Held()
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  held.step()
  machine.stepped([0, 1])
  assert machine.restored() == [lm.Rejoin("restored")] and machine.inflight == {}
  machine.join_sent(1.0)
  assert machine.join_answered({0, 1}) == []
  assert machine.arrived(_values(0, 3)) == [lm.Apply(_values(0, 3))]
  held.apply(_values(0, 3))
  assert machine.arrived(_values(1, 2)) == [lm.Apply(_values(1, 2)), lm.Rejoined()]
  # One whose Join is answered with nothing (it held the current versions) is back at once.
  assert machine.restored() == [lm.Rejoin("restored")]
  assert machine.join_answered(set()) == [lm.Rejoined()]


def test_a_synchronizer_restart_resends_what_is_unanswered():
  held = Held(c_steps=[2, 2], steps=2)
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  machine.stepped([1])
  assert machine.sync_restarted() == [lm.Rejoin("sync_restart"), lm.Resend(1, None)]
  assert machine.resend_due(1, None, now=1.0) == [lm.Upload(1)]


@pytest.mark.parametrize("named", [True, False])
def test_a_rebasing_learner_back_from_a_synchronizer_restart_resends_after_the_joins_answer(named):
  # Fragment 0 uploaded at step 2 on version 0, then 2 more steps. The synchronizer restarts; its
  # checkpoint may hold a merge of that upload whose send was lost. Under rebase a copy computed
  # afresh on a newer base is no duplicate of it, so the machine joins and waits for the answer:
  # one that names the upload as merged (`Send.own`) answers it, one that does not leaves it
  # unanswered. Either way the fragment goes again now, with what the learner has beyond what
  # was merged (`resend_due` sends it only if that is some progress).
  held = Held(c_steps=[2, 2], steps=2, delivery="rebase")
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  assert machine.stepped([0]) == [lm.Upload(0)]
  held.step(), held.step()
  assert machine.sync_restarted() == [lm.Rejoin("sync_restart")]
  assert machine.join_answered({0, 1}) == []  # the answer owes fragments 0 and 1
  assert machine.arrived(_values(1, 3, gen=1)) == [lm.Apply(_values(1, 3, gen=1))]
  answer = _update(0, 1, own=named)
  assert machine.arrived(answer) == [lm.Apply(answer), lm.Resend(0, None)]
  assert machine.undelivered() == ({} if named else {0: 4})


def test_a_rebasing_learner_resends_at_once_when_the_join_is_answered_with_nothing():
  held = Held(c_steps=[2, 2], steps=2, delivery="rebase")
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  machine.stepped([1])
  assert machine.shard_restarted([1]) == [lm.Rejoin("shard_restart")]
  assert machine.join_answered(set()) == [lm.Resend(1, None)]


def test_a_real_time_join_resends_what_was_decided_while_the_synchronizer_was_away():
  # Issue 49, point 3: steps 1-3 uploaded fragment 0 (unanswered when the synchronizer died);
  # steps 4-6 ran unjoined and made fragment 1 due (decided, held). A Join to the restarted
  # synchronizer sends both again, computed afresh: before, it cleared them, and a learner that
  # finished during the outage never sent that progress.
  held = Held(c_steps=[3, 3], steps=3)
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  assert machine.stepped([0]) == [lm.Upload(0)]
  for _ in range(3):
    held.step()
  assert machine.stepped([1]) == [lm.Upload(1)] and held.c_steps == [6, 6]
  assert machine.undelivered() == {0: 6, 1: 6}
  assert machine.joined_unseen() == [lm.Resend(0, None), lm.Resend(1, None)]
  assert machine.resend_due(0, None, now=1.0) == [lm.Upload(0)]
  machine.arrived(_update(0, 1))  # fragment 0's merge: answered
  assert machine.undelivered() == {1: 6}


@pytest.mark.parametrize("answer", ["merged", "duplicate", "stale"])
def test_a_rebasing_learners_join_sends_its_unanswered_uploads_as_they_were(answer):
  # Fragment 0's upload is unanswered at a Join: it goes again as it was (`as_sent`), and what
  # was trained after it waits for the merge that names it. Refused as a duplicate (it was
  # merged), the learner resyncs and still waits for that merge; refused for another reason
  # (not merged), all of its progress goes at once, computed afresh.
  held = Held(c_steps=[3, 3], steps=3, delivery="rebase")
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  machine.stepped([0])
  resends = [lm.Resend(0, None, as_sent=True), lm.Resend(1, None)]
  assert machine.joined_unseen(answered={1}) == resends
  assert machine.resend_due(0, None, now=7.0, as_sent=True) == [lm.Upload(0)]
  if answer == "stale":
    assert machine.refused(_refused(0, Code.STALE, 7.0)) == [lm.Resend(0, None)]
    return
  merge = _update(0, 1, own=True)
  if answer == "duplicate":  # (on the version held: the merge rebases, and the rest goes)
    assert machine.refused(_refused(0, Code.DUPLICATE, 7.0)) == [lm.Rejoin("refused")]
    assert machine.arrived(merge) == [lm.Apply(merge, rebase=True), lm.Resend(0, (0, 1))]
  else:
    assert machine.arrived(merge) == [lm.Apply(merge), lm.Resend(0, None)]
  held.apply(merge)
  later = _update(0, 2, own=True)
  assert machine.arrived(later) == [lm.Apply(later)]  # once only


def test_a_send_buffered_before_a_synchronizer_restart_is_stale_after_the_join():
  # tests/test_grpc.py's chaos run, learner 0, fragment 3: its upload was merged just before
  # the synchronizer was killed, and the merge's send (generation 0, naming that upload) sat in
  # its link's buffer through the outage. Taken after the Join to generation 1, it answered the
  # upload; the Join's answer then brought the same version again (generation 1, naming the same
  # upload, which the learner no longer held): the learner replaced the fragment, dropping the
  # 14 steps trained since, and sent nothing. Now the buffered send is dropped as stale, and the
  # answer's copy answers the upload and sends what was trained after it.
  held = Held(versions=[1, 1], c_steps=[2, 2], steps=2, delivery="rebase")
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  assert machine.stepped([0]) == [lm.Upload(0)]  # on (0, 1); merged as (0, 2), then the kill
  for _ in range(3):  # trained on while the synchronizer was away
    held.step()
  machine.join_sent(10.0)
  machine.joined(1)
  machine.joined(None)  # (a link that cannot tell changes nothing)
  stale = _update(0, 2, base_gen=0, gen=0, own=True)
  assert machine.arrived(stale) == [lm.Drop(stale, Code.OLD_GENERATION)]
  assert machine.undelivered() == {0: 5}  # still unanswered
  assert machine.joined_unseen() == [lm.Resend(0, None, as_sent=True)]
  assert machine.resend_due(0, None, now=11.0, as_sent=True) == [lm.Upload(0)]
  answer = Send(0, 0, 2, values=VALUES, generation=1, own=stale.own)  # the Join's answer
  assert machine.arrived(answer) == [lm.Apply(answer), lm.Resend(0, None)]
  newer = _values(1, 3, gen=1)  # (the joined generation's own sends are taken)
  assert machine.arrived(newer) == [lm.Apply(newer)]


def test_a_duplicate_on_the_version_held_rebases_the_arrival_and_resends_the_rest():
  # Its upload of fragment 0 on (0, 0) was merged and the synchronizer died before the answer
  # came; the copy sent after the Join is refused as a duplicate of that base. The merged
  # version then arrives with rebase=True (the steps after the upload are kept), and what is
  # kept is sent again on the new base.
  held = Held(c_steps=[5, 5], steps=5)
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  machine.join_sent(1.0)
  assert machine.joined_unseen() == []
  machine.stepped([0])
  decisions = machine.refused(_refused(0, Code.DUPLICATE, sent=2.0, base=(0, 0)))
  assert decisions == [lm.Rejoin("refused")] and machine.merged_unseen == {0}
  machine.refused(_refused(1, Code.DUPLICATE, sent=2.0, base=(0, 3)))
  assert machine.merged_unseen == {0}  # (a duplicate of another base: not the version held)
  send = _values(0, 2, gen=1)
  assert machine.arrived(send) == [lm.Apply(send, rebase=True), lm.Resend(0, (1, 2))]
  held.apply(send)
  held.c_steps[0] = 3  # (what Learner.receive keeps)
  assert machine.resend_due(0, (1, 2), now=3.0) == [lm.Upload(0)] and not machine.merged_unseen
  assert machine.arrived(_update(0, 3, base_gen=1, gen=1)) == [lm.Apply(_update(0, 3, 1, 1))]


def test_an_older_version_from_a_restarted_synchronizer_is_taken_as_base_and_resent():
  # It holds version 5 of fragment 0 (generation 0); the synchronizer, saving every few merges,
  # restarted at version 3 and answers the Join with it. Applied as the new base
  # (Learner.receive keeps the parameters), and the difference is sent again.
  held = Held(versions=[5, 5], c_steps=[4, 4], steps=9)
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  send = _values(0, 3, gen=1)
  assert lm.regressed(send, held) and not lm.regressed(_values(0, 6, gen=1), held)
  assert not lm.regressed(_values(0, 3, gen=0), held)  # (a duplicate: dropped, see verdict)
  assert machine.arrived(send) == [lm.Apply(send), lm.Resend(0, (1, 3))]


def test_a_fragment_sent_again_on_a_regressed_answer_is_not_sent_a_second_time_after_the_join():
  # A rebasing learner restored at its end (fragment 0 unanswered, 4 steps) joins a restarted
  # synchronizer whose answer, read first, is an older version: it sends fragment 0 again on
  # it, with everything. Its unanswered upload is not sent once more as it was: that copy has
  # the same key, was refused as a duplicate and made the learner join again.
  held = Held(versions=[5, 5], c_steps=[4, 0], steps=8, delivery="rebase")
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  machine.holding()
  machine.join_sent(10.0)
  send = _values(0, 3, gen=1)
  assert machine.arrived(send) == [lm.Apply(send), lm.Resend(0, (1, 3))]
  held.apply(send)
  held.c_steps[0] = 4  # (Learner.receive keeps its parameters and counters)
  assert machine.resend_due(0, (1, 3), now=10.5) == [lm.Upload(0)]
  assert machine.joined_unseen() == [] and machine.undelivered() == {0: 4}
  machine.join_sent(20.0)  # a later Join sends it again as it was (it may have been lost)
  assert machine.joined_unseen() == [lm.Resend(0, None, as_sent=True)]


def test_a_learner_restored_at_its_end_holds_its_progress_as_unanswered():
  held = Held(c_steps=[4, 0], steps=8)
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  machine.holding()  # fragment 1 was received after its last step: nothing to deliver
  assert machine.undelivered() == {0: 4}
  assert machine.joined_unseen() == [lm.Resend(0, None)]


# ---- random event sequences ----


class LearnerProtocol(RuleBasedStateMachine):
  """A learner's machine under random events; a model of the synchronizer's versions.

  Properties: (1) an Apply is always of a send built on what the learner holds (an update on
  exactly its version, full values only newer); (2) no fragment has two unanswered uploads
  against one version, unless the machine said to send it again; (3) a restored learner joins
  before anything else and trains only after its Join's answer has fully arrived.
  """

  DELIVERY = "replace"

  def __init__(self):
    super().__init__()
    self.held = Held(delivery=self.DELIVERY)
    self.machine = lm.LearnerMachine(self.held, P, blocking=False, overlap=1)
    self.version = [0] * P  # the synchronizer's
    self.gen = 0
    self.outstanding: dict[int, tuple] = {}  # p -> base of the unanswered upload (the model's)
    self.now = 0.0
    self.restoring = False
    self.joined_after_restore = False

  def _tick(self):
    self.now += 1.0
    return self.now

  def _carry_out(self, decisions):
    for d in decisions:
      if isinstance(d, lm.Apply):
        s = d.send
        have = (self.held.generations[s.fragment], self.held.versions[s.fragment])
        if s.update is not None:
          assert (s.base_generation, s.version - 1) == have, (s, have)  # property 1
        else:
          assert (s.generation, s.version) > have, (s, have)
        answers = self.DELIVERY == "replace" or s.includes_own or have[1] < 0
        self.held.apply(s)
        if answers:  # (under rebase and at_own_sync, only its own merge answers its upload)
          self.outstanding.pop(s.fragment, None)
      elif isinstance(d, lm.Rejoin):
        self.machine.join_sent(self._tick())
        if self.restoring:
          self.joined_after_restore = True
      elif isinstance(d, lm.Resend):
        self.outstanding.pop(d.fragment, None)  # told to send it again
        self._carry_out(self.machine.resend_due(d.fragment, d.base, self._tick()))
      elif isinstance(d, lm.Upload):
        p = d.fragment
        assert p not in self.outstanding, f"fragment {p} uploaded twice on {self.outstanding}"
        self.outstanding[p] = (self.held.generations[p], self.held.versions[p])
      elif isinstance(d, lm.Rejoined):
        assert self.restoring and self.joined_after_restore  # property 3
        self.restoring = False

  @precondition(lambda self: not self.restoring)
  @rule(due=st.sets(st.integers(0, P - 1)))
  def step(self, due):
    self.held.step()
    self._carry_out(self.machine.stepped(sorted(due)))

  @rule(
      p=st.integers(0, P - 1),
      kind=st.sampled_from(["next", "own", "dup", "gap", "corrupt", "full"]),
  )
  def merged_fragment_arrives(self, p, kind):
    v, g = self.held.versions[p], self.held.generations[p]
    if kind == "own" and p not in self.outstanding:
      kind = "next"  # only an upload pending there can be merged
    send = {
        "next": _update(p, v + 1, base_gen=g, gen=max(g, self.gen)),
        "own": _update(p, v + 1, base_gen=g, gen=max(g, self.gen), own=True),
        "dup": _update(p, max(v, 1), base_gen=g, gen=g),
        "gap": _update(p, v + 2, base_gen=g, gen=max(g, self.gen)),
        "corrupt": _update(p, v + 1, base_gen=g, gen=max(g, self.gen), corrupt=True),
        "full": _values(p, self.version[p] + 1, gen=self.gen),
    }[kind]
    self.version[p] = max(self.version[p], send.version)
    self._carry_out(self.machine.arrived(send))

  @rule(p=st.integers(0, P - 1), code=st.sampled_from(sorted(Code, key=str)))
  def upload_refused(self, p, code):
    base = self.outstanding.pop(p, None)
    if base is None:
      return  # only an upload in flight can be refused
    self._carry_out(self.machine.refused(_refused(p, code, self._tick(), base)))

  @rule()
  def join_answered(self):
    if self.machine.join_inflight:
      missing = {p for p in range(P) if self.held.versions[p] != self.version[p]}
      self._carry_out(self.machine.join_answered(missing))
      for p in sorted(missing):  # the answer arrives
        self._carry_out(self.machine.arrived(_values(p, self.version[p], gen=self.gen)))

  @rule()
  def crash_and_restore(self):
    self.machine.crashed()
    self.outstanding.clear()
    self.restoring, self.joined_after_restore = True, False
    decisions = self.machine.restored()
    assert decisions and isinstance(decisions[0], lm.Rejoin)  # property 3: it joins first
    self._carry_out(decisions)

  @rule()
  def synchronizer_restarts(self):
    self.gen += 1
    self.machine.sync_lost()
    self._carry_out(self.machine.sync_restarted())

  @rule()
  def stall_broken(self):
    for p in self.machine.give_up():
      self.outstanding.pop(p, None)

  @invariant()
  def the_machine_waits_for_exactly_the_unanswered_uploads(self):
    assert set(self.machine.inflight) == set(self.outstanding)


LearnerProtocol.TestCase.settings = hypothesis.settings(
    max_examples=150, stateful_step_count=40, deadline=None, derandomize=True, database=None
)
TestLearnerProtocol = LearnerProtocol.TestCase


class RebaseProtocol(LearnerProtocol):
  DELIVERY = "rebase"


class AtOwnSyncProtocol(LearnerProtocol):
  DELIVERY = "at_own_sync"


RebaseProtocol.TestCase.settings = LearnerProtocol.TestCase.settings
AtOwnSyncProtocol.TestCase.settings = LearnerProtocol.TestCase.settings
TestRebaseProtocol = RebaseProtocol.TestCase
TestAtOwnSyncProtocol = AtOwnSyncProtocol.TestCase


def test_an_upload_refused_for_a_base_the_restart_lost_goes_again_on_the_joins_answer():
  """Issue 72's gRPC run (learner 1, fragment 3). The synchronizer, saving every few merges,
  restarted without the merge of learner 1's upload (version 1 of generation 0); learner 0's
  merge then made version 1 of generation 1. Learner 1, done training while it was away (8
  steps of fragment 0 unsent), joins holding (0, 1): the answer sends fragment 0 at (1, 1), but
  the real-time loop sends its unanswered upload (`joined_unseen`) before that answer is
  delivered, on the base the restored synchronizer lacks: refused, unknown_base_version (not
  counted as refused steps), and the learner joins again. The answer, applied under rebase,
  keeps the 8 steps (not `regressed`: the same version number); nothing sent them again (no
  step left to schedule an upload) and the learner settled with them."""
  params = {"blocks": {0: {"w": np.zeros(3, np.float32)}, 1: {"w": np.zeros(2, np.float32)}}}
  frag = fragments.strided(params, 2)
  sync = Synchronizer(params, frag, policies.SYNCHRONOUS, optimizers.nesterov(0.5, 0.5))
  delta = lambda p: compression.encode_tree(
      {k: np.full(v.shape, 0.1, np.float32) for k, v in sync.globals[p].items()}, "fp32"
  )

  def upload(m, held_gen, held_v, steps, t):
    return Upload(m, 0, held_v, delta(0), steps, 8 * steps, t, t, 1.0, base_generation=held_gen)

  sync.handle(Join(1, 0.0, (0, 0)))
  saved = sync.state_dict()  # the last save before the merge the restart loses
  assert any(isinstance(a, Send) for a in sync.handle(upload(1, 0, 0, 2, 1.0)))  # v1, gen 0
  sync.restart(saved, generation=1)
  sync.handle(Join(0, 2.0, (0, 0), (0, 0)))
  sync.handle(upload(0, 0, 0, 6, 2.5))  # learner 0's merge: version 1 of generation 1
  sync.handle(Leave(0, 2.6))
  assert sync.versions == [1, 0] and sync.generation == 1

  held = Held(versions=[1, 0], c_steps=[8, 0], steps=10, delivery="rebase")
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=2)
  assert machine.stepped([0]) == [lm.Upload(0)]  # decided while the synchronizer was away
  answer = [a for a in sync.handle(Join(1, 3.0, (1, 0), (0, 0))) if isinstance(a, Send)]
  assert [(s.fragment, s.generation, s.version) for s in answer] == [(0, 1, 1)]
  machine.joined(1)
  machine.join_sent(3.0)
  decisions = machine.joined_unseen()  # (the answer is not delivered yet)
  assert decisions == [lm.Resend(0, None, as_sent=True)]
  assert machine.resend_due(0, None, now=3.1, as_sent=True) == [lm.Upload(0)]
  # (computed afresh: `Learner.sent_again` holds no copy, and the upload stamps its own time)
  refused = sync.handle(upload(1, 0, 1, 8, 3.15))
  assert [r.code for r in refused] == [Code.UNKNOWN_BASE_VERSION]
  assert machine.refused(refused[0]) == [lm.Rejoin("refused")]
  machine.join_sent(3.2)
  sync.handle(Join(1, 3.2, (1, 0), (0, 0)))
  assert machine.joined_unseen() == []
  # The first answer arrives: applied keeping the 8 steps (Learner.receive's rebase), which
  # go again on the new base.
  decisions = machine.arrived(answer[0])
  assert decisions == [lm.Apply(answer[0]), lm.Resend(0, (1, 1))]
  held.versions[0], held.generations[0], held.sync_generation = 1, 1, 1  # (c_steps kept)
  assert machine.resend_due(0, (1, 1), now=3.3) == [lm.Upload(0)]
  merged = sync.handle(upload(1, 1, 1, 8, 3.3))
  logs = [a.record for a in merged if isinstance(a, Log) and a.record.get("event") == "merge"]
  assert [(r["learners"], r["steps"]) for r in logs] == [([1], [8])]


def test_an_upload_refused_for_its_base_after_a_newer_version_arrived_goes_again_at_once():
  held = Held(c_steps=[5, 5], steps=5, delivery="rebase")
  machine = lm.LearnerMachine(held, P, blocking=False, overlap=1)
  machine.stepped([0])
  held.versions[0], held.generations[0], held.sync_generation = 2, 1, 1  # (rebase kept c_steps)
  decisions = machine.refused(_refused(0, Code.UNKNOWN_BASE_VERSION, sent=2.0, base=(0, 0)))
  assert decisions == [lm.Rejoin("refused"), lm.Resend(0, (1, 2))] and not machine.refused_base
  assert machine.resend_due(0, (1, 2), now=3.0) == [lm.Upload(0)]
