"""The delivery rules (`outer.delivery`) on a real learner, by hand: where each keeps or loses
the progress a learner made between its syncs.

Learner 0 of the tiny Decoupled runlocal config with an fp32 uplink (so that an upload decodes to
exactly Θ_base − θ); its fragment 0 starts at Θ0 (version 0). "Another learner's merge" is a
full-values Send of version 1, Θ1 = Θ0 − 1/4 (not merging learner 0's upload); "its own merge" is
an update to version 2 that does (`Send.own`, the key of the upload merged).
"""

import jax
import numpy as np
import pytest

from configs import shakespeare
from diloco import train
from diloco.config import build, checks
from diloco.outer import protocol
from diloco.outer.learner import learner_machine
from diloco.outer.codecs import compression
from diloco.outer.outcomes import Code


def _learner(delivery: str, overlap: int = 0, alpha: float = 0.0, anchor: str = "base"):
  c = shakespeare.get_config("runlocal,mode=decoupled")
  c.outer.update(dict(codec="fp32", delivery=delivery, overlap=overlap, alpha=alpha, anchor=anchor))
  parts = build.local_learners(c)
  return parts.make_learner(0, holds_start=True), parts.islands[0].data.train_iter


def _steps(learner, batches, n: int) -> None:
  for _ in range(n):
    learner.step(next(batches))


def _same(a: dict, b: dict) -> bool:
  return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def _others(learner) -> tuple[dict, protocol.Send]:
  one = {k: v - 0.25 for k, v in learner.global_copy[0].items()}
  return one, protocol.Send(0, 0, 1, values=one)


def _own(learner, version: int) -> tuple[dict, protocol.Send]:
  step = {k: np.full_like(v, -0.125) for k, v in learner.global_copy[0].items()}
  update = compression.encode_tree(step, "fp32")
  send = protocol.Send(0, 0, version, update=update, own=learner.sent[0][-1].key)
  return {k: learner.global_copy[0][k] + step[k] for k in step}, send


def _upload(learner, t: float):
  return learner.upload(0, sent_time=t, arrival_time=0.0, step_time=0.0)


def test_replace_drops_the_progress_since_the_learners_own_upload():
  learner, batches = _learner("replace")
  _steps(learner, batches, 2)
  _upload(learner, 0.0)
  _steps(learner, batches, 1)
  one, send = _others(learner)
  learner.receive(send)
  assert _same(learner._read(0), one) and learner.c_steps[0] == 0  # 3 steps gone, 2 in flight


def test_rebase_keeps_what_the_merge_lacks_and_drops_only_its_own_merged_upload():
  learner, batches = _learner("rebase")
  theta0 = learner.global_copy[0]
  _steps(learner, batches, 2)
  up = _upload(learner, 0.0)
  assert up.steps == up.step == 2 and learner.c_steps[0] == 2  # the counters go on until merged
  _steps(learner, batches, 1)
  before = learner._read(0)
  one, send = _others(learner)
  learner.receive(send)  # another learner's merge: all 3 steps kept on top of it
  assert _same(learner._read(0), {k: one[k] + (before[k] - theta0[k]) for k in one})
  assert learner.c_steps[0] == 3 and learner.sent[0] == [up] and learner.versions[0] == 1
  _steps(learner, batches, 1)
  before = learner._read(0)
  two, send = _own(learner, 2)
  learner.receive(send)  # its own merge holds u (2 steps): the 2 steps after u are kept
  u = compression.decode_tree(up.delta)
  kept = {k: two[k] + ((before[k] - one[k]) + u[k]) for k in two}
  assert _same(learner._read(0), kept) and learner.c_steps[0] == 2 and 0 not in learner.sent
  nxt = _upload(learner, 1.0)  # what it sends next is those 2 steps only: nothing twice
  assert nxt.steps == 2 and nxt.base_version == 2
  sent = compression.decode_tree(nxt.delta)
  assert _same(sent, {k: two[k] - kept[k] for k in two})


def test_at_own_sync_holds_merges_until_its_own_merge_follows_its_upload():
  learner, batches = _learner("at_own_sync")
  theta0 = learner.global_copy[0]
  _steps(learner, batches, 2)
  before = learner._read(0)
  one, send = _others(learner)
  learner.receive(send)  # held: θ untouched, the newest version known
  assert _same(learner._read(0), before) and learner.c_steps[0] == 2
  assert (learner.versions[0], learner.base_versions[0]) == (1, 0)
  _steps(learner, batches, 1)
  before = learner._read(0)
  up = _upload(learner, 0.0)  # its sync: all 3 steps against version 0
  assert (up.base_version, up.steps) == (0, 3)
  assert _same(compression.decode_tree(up.delta), {k: theta0[k] - before[k] for k in theta0})
  assert _same(learner._read(0), before) and learner.adopt_at[0] == 3  # its merge not back yet
  two, send = _own(learner, 2)
  learner.receive(send)  # the version merging its upload: taken at once (tau = 0)
  assert _same(learner._read(0), two) and learner.c_steps[0] == 0
  assert learner.base_versions[0] == 2 and learner.adopt_at[0] == -1


def test_rebase_takes_the_upload_a_rejoin_answer_names_and_a_restored_learner_starts_over():
  # Learner 0 uploads u (2 steps) on version 0 and trains 1 more step; the merge of u is lost in
  # a synchronizer restart, and after its Join it sends the fragment again, computed afresh (3
  # steps, the same base). The Join's answer, version 1 in full, names u: only the step after u
  # is kept on top of it (the copy's 3 would count u's 2 twice).
  learner, batches = _learner("rebase")
  theta0 = learner.global_copy[0]
  _steps(learner, batches, 2)
  u = _upload(learner, 0.0)
  _steps(learner, batches, 1)
  copy = _upload(learner, 1.0)
  assert (copy.key, u.key) == ((0, 0, 3), (0, 0, 2))
  before = learner._read(0)
  one = {k: v - 0.25 for k, v in theta0.items()}
  learner.receive(protocol.Send(0, 0, 1, values=one, own=u.key))
  d = compression.decode_tree(u.delta)
  assert _same(learner._read(0), {k: one[k] + ((before[k] - theta0[k]) + d[k]) for k in one})
  assert learner.c_steps[0] == 1 and 0 not in learner.sent
  # A learner restored from a checkpoint from before u knows no upload of that key: the progress
  # it holds since version 0 is in the merge, and it takes version 1 as it is.
  restored, _ = _learner("rebase")
  _steps(restored, batches, 1)
  restored.receive(protocol.Send(0, 0, 1, values=one, own=u.key))
  assert _same(restored._read(0), one) and restored.c_steps[0] == 0


def test_rebase_takes_a_second_join_answer_naming_an_upload_already_merged_as_anothers_merge():
  # The slow link of tests/test_net_faults.py: the answer of one Join (version 1, naming u)
  # reached the learner after its next Join had left reporting version 0, and that Join's
  # answer (version 3) names u again. The learner's machine takes the second as a merge that
  # does not hold its pending upload u2: θ keeps every step since version 1, u2 stays pending.
  # (Before, the learner found no pending u, replaced θ with version 3 and lost those steps.)
  learner, batches = _learner("rebase")
  machine = learner_machine.LearnerMachine(learner, 1, blocking=False, overlap=0)
  arrive = lambda send: [d for d in machine.arrived(send) if isinstance(d, learner_machine.Apply)]
  theta0 = learner.global_copy[0]
  _steps(learner, batches, 2)
  assert machine.stepped([0]) == [learner_machine.Upload(0)]
  u = _upload(learner, 0.0)
  _steps(learner, batches, 1)
  one = {k: v - 0.25 for k, v in theta0.items()}
  (first,) = arrive(protocol.Send(0, 0, 1, values=one, own=u.key))
  learner.receive(first.send)  # u's 2 steps are in version 1: the 1 after it is kept
  assert learner.c_steps[0] == 1 and machine.stepped([0]) == [learner_machine.Upload(0)]
  u2 = _upload(learner, 1.0)
  _steps(learner, batches, 2)
  before = learner._read(0)
  three = {k: v - 0.5 for k, v in theta0.items()}
  (second,) = arrive(protocol.Send(0, 0, 3, values=three, own=u.key))
  assert second.send.own is None and second.send.checksum_ok()
  learner.receive(second.send)
  assert _same(learner._read(0), {k: three[k] + (before[k] - one[k]) for k in three})
  assert learner.c_steps[0] == 3 and learner.sent[0] == [u2] and machine.undelivered() == {0: 3}
  _, four = _own(learner, 4)  # then u2's own merge: the 2 steps after it stay
  (last,) = arrive(four)
  assert last.send.own == u2.key
  learner.receive(last.send)
  assert learner.c_steps[0] == 2 and machine.undelivered() == {}


def test_rebase_after_a_duplicate_waits_for_the_merge_that_names_the_upload():
  # The slow link again: u (2 steps on version 0) was unanswered at a Join, and its copy
  # computed afresh was refused as a duplicate (u had been merged). The Join's answer, queued
  # before that merge, then arrives: version 1, naming nothing. It does not hold u, so all 3
  # steps stay on top of it; the merge that names u then takes u's 2 steps out and the rest goes
  # again. (Before, version 1 took u as merged, and the merge naming u, no longer pending,
  # replaced θ: the progress since was lost.)
  learner, batches = _learner("rebase")
  machine = learner_machine.LearnerMachine(learner, 1, blocking=False, overlap=0)
  theta0 = learner.global_copy[0]
  _steps(learner, batches, 2)
  machine.stepped([0])
  u = _upload(learner, 0.0)
  _steps(learner, batches, 1)
  machine.join_sent(5.0)
  assert machine.joined_unseen() == [learner_machine.Resend(0, None, as_sent=True)]
  assert machine.resend_due(0, None, now=5.0, as_sent=True) == [learner_machine.Upload(0)]
  assert learner.sent_again(0, 5.0) is None  # (on the version held: computed afresh)
  copy = _upload(learner, 5.1)
  learner.not_merged(0, copy.sent_time)
  refused = protocol.Refused(0, 0, Code.DUPLICATE, "", 5.2, copy.sent_time, 0, 0)
  assert machine.refused(refused) == [learner_machine.Rejoin("refused")]
  before = learner._read(0)
  one, answer = _others(learner)
  assert machine.arrived(answer) == [learner_machine.Apply(answer)]
  learner.receive(answer)
  assert _same(learner._read(0), {k: one[k] + (before[k] - theta0[k]) for k in one})
  assert learner.c_steps[0] == 3 and learner.sent[0] == [u]
  _steps(learner, batches, 1)
  before = learner._read(0)
  two, merge = _own(learner, 2)
  assert merge.own == u.key
  want = [learner_machine.Apply(merge, rebase=True), learner_machine.Resend(0, (0, 2))]
  assert machine.arrived(merge) == want
  learner.receive(merge, rebase=True)
  d = compression.decode_tree(u.delta)
  assert _same(learner._read(0), {k: two[k] + ((before[k] - one[k]) + d[k]) for k in two})
  assert learner.c_steps[0] == 2


def test_at_own_sync_with_overlap_takes_the_newest_tau_steps_later_mixed_by_alpha():
  learner, batches = _learner("at_own_sync", overlap=2, alpha=0.5)
  _steps(learner, batches, 2)
  _upload(learner, 0.0)
  assert learner.adopt_at[0] == 4 and learner.base_versions[0] == 0
  _, send = _own(learner, 1)
  learner.receive(send)  # its own merge, one step early: held
  _steps(learner, batches, 1)
  two, send = _others(learner)
  send = protocol.Send(0, 0, 2, values=two)  # then another learner's
  learner.receive(send)
  assert learner.base_versions[0] == 0
  twin, _ = _learner("replace")  # the same step without the mix: θ before it is taken
  twin.state = jax.tree.map(lambda x: x.copy(), learner.state)  # (steps donate their state)
  batch = next(batches)
  twin.step(batch)
  learner.step(batch)  # step 4 = 2 + tau: then θ ← α θ + (1 − α) Θ2
  stepped = twin._read(0)
  assert _same(learner._read(0), {k: 0.5 * stepped[k] + 0.5 * two[k] for k in two})
  assert learner.base_versions[0] == 2 and learner.adopt_at[0] == -1 and learner.c_steps[0] == 0


def test_at_own_sync_after_a_refused_upload_sends_its_progress_again():
  learner, batches = _learner("at_own_sync")
  _steps(learner, batches, 2)
  up = _upload(learner, 0.0)
  learner.not_merged(0, up.sent_time)  # refused: nothing to take, the 2 steps stay
  _steps(learner, batches, 1)
  again = _upload(learner, 1.0)
  assert (again.base_version, again.steps) == (0, 3) and learner.adopt_at[0] == 3


def test_at_own_sync_keeps_its_base_through_a_checkpoint():
  learner, batches = _learner("at_own_sync", overlap=2)
  _steps(learner, batches, 2)
  _upload(learner, 0.0)
  one, send = _others(learner)
  learner.receive(send)
  saved = learner.checkpoint_state()
  twin, _ = _learner("at_own_sync", overlap=2)
  twin.load_checkpoint_state(saved)
  assert (twin.versions[0], twin.base_versions[0], twin.adopt_at[0]) == (1, 0, 4)
  assert twin.own_merged == learner.own_merged == [0] * len(twin.own_merged)
  assert _same(twin.base_copy[0], learner.base_copy[0]) and _same(twin.global_copy[0], one)


def test_under_the_global_anchor_a_learner_uploads_its_fragment():
  learner, batches = _learner("at_own_sync", anchor="global")
  _steps(learner, batches, 2)
  up = _upload(learner, 0.0)
  assert _same(compression.decode_tree(up.delta), learner._read(0)) and up.base_version == 0


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(delivery="keep"), "outer.delivery"),
        (dict(delivery="rebase", alpha=0.5), "alpha"),
        (dict(anchor="latest"), "outer.anchor"),
        (dict(anchor="global", delivery="rebase"), "outer.delivery=rebase"),
        (dict(anchor="global", delivery="replace", codec="fp4"), "outer.codec='fp4'"),
        (
            dict(anchor="global", delivery="replace", codec="fp32", error_feedback=True),
            "error feedback",
        ),
    ],
)
def test_a_delivery_rule_that_makes_no_sense_is_refused_by_name(overrides, key):
  c = shakespeare.get_config("runlocal,mode=decoupled")
  c.outer.update(overrides)
  with pytest.raises(ValueError, match=key):
    checks.check(c)


def test_in_the_synchronous_limit_every_rule_is_synchronous_diloco(tmp_path):
  """Synchronous DiLoCo (every merge holds every learner, blocking, tau = 0, fp32 uplink): a
  learner has nothing after its upload, and fl(θ − Θ) + fl(Θ − θ) = 0 exactly, so rebase and
  at_own_sync take exactly the merged version, as replace does: the same bits on the virtual
  runtime, end to end."""
  sha = {}
  for rule in ("replace", "rebase", "at_own_sync"):
    c = shakespeare.get_config("runlocal,mode=diloco,steps=30")
    c.outer.delivery, c.timeline = rule, False
    summary = train.train_and_evaluate(c, str(tmp_path / rule))
    assert summary["merged_share"] == 1.0  # steps 30, H 10: every upload merged
    sha[rule] = summary["params_sha256"]
  assert sha["rebase"] == sha["at_own_sync"] == sha["replace"]
