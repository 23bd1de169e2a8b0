"""Faults the kernel makes between real hosts (experiments/studies/net_faults.py): a synchronizer
and two gRPC learner processes, each in its own network namespace behind a bridge; partitions
(`ip link set down` on the bridge's end: no reset, the peer is not told), a token-bucket slow
link (`tc tbf`), SIGSTOP. Timeouts scaled down by configuration: absence 1.5 s, call deadline
2 s, keepalive 2 s, long poll 0.5 s (net_faults.TIMEOUTS). Five faults share one run (a
module fixture); the slow link and the synchronizer away past the deliver timeout have runs
of their own. Needs root.

Every learner trains on through each fault at a quarter of its pace before the first one at
least, and no Join or upload call held its training thread for half a call's deadline: its
Joins, uploads and polls are made by threads (runtime/async_link.py). Before, each Join and
upload held the training thread up to its deadline: 5 and 0 steps in a 4 s cut of the
synchronizer, about 60 unfaulted; on a tenth of the link it needed, no step logged in 6 s."""

import pytest

from configs import shakespeare
from diloco.rpc import limits as limits_lib, netns
from experiments.studies import net_faults as nf

WHY = netns.available()


def needs_root(test):
  """Skipped where namespaces cannot be made; slow (real processes: out of the developers' tier)."""
  return pytest.mark.slow(pytest.mark.skipif(bool(WHY), reason=WHY or "")(test))


SLACK_S = 1.5  # scheduling on two loaded cores, on top of every bound below


def _wall(out, row) -> float:
  return out["sync"]["wall_t0"] + row["time"]


def _events(out, event, learner=None) -> list[float]:
  """Wall times of the synchronizer's `event` rows (of `learner`)."""
  return [
      _wall(out, r)
      for r in out["sync_rows"]
      if r.get("event") == event and (learner is None or r.get("learner") == learner)
  ]


def _merges(out, t_from, t_to) -> list[dict]:
  return [m for m in out["merges"] if t_from <= _wall(out, m) <= t_to]


def _delivered(out) -> None:
  """The run finished and nothing a learner trained was left undelivered."""
  assert out["codes"] == {"sync": 0, "learner0": 0, "learner1": 0}, out["codes"]
  for m in (0, 1):
    assert out[f"learner{m}"]["undelivered_steps"] == {}, m
  assert out["learner0"]["global_crc"] == out["learner1"]["global_crc"]  # (one global state)


def _noticed(out, m, t, bound_s) -> float:
  """Seconds from `t` until learner m's link said the synchronizer stopped answering."""
  took = nf.first_after(out["links"][m], "unreachable", t)
  assert took is not None and took <= bound_s + SLACK_S, (took, out["links"][m])
  return took


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
  """One run through the five faults (net_faults.faults), shared by the tests below (each skipped
  before it is set up where namespaces cannot be made)."""
  out = nf.faults(str(tmp_path_factory.mktemp("faults")))
  _delivered(out)  # the run finished, nothing any learner trained left undelivered
  return out


@needs_root
def test_no_call_held_a_learners_training_thread_through_five_faults(faults):
  # Its Joins and uploads are made by threads (async_link.py): through every fault of the run
  # none held the training thread near a call's deadline (before: each held it that long).
  for m in (0, 1):
    longest = faults[f"learner{m}"]["longest_call_s"]
    assert longest < 0.5 * nf.CALL_S, (m, longest)


def _pace(out, m) -> float:
  """Learner m's steps per second from its slowed pace's start to the first fault."""
  t_from, t_to = out["marks"]["paced"], out["marks"]["learner_cut"]["cut"]
  rows = [r for r in out["progress"][m] if t_from <= r[0] <= t_to]
  assert len(rows) >= 2, (m, rows)  # (the harness waits for `gap` steps of each: 3 rows)
  (t0, s0), (t1, s1) = rows[0], rows[-1]
  return (s1 - s0) / (t1 - t0)


def _steps_between(out, m, t_from, t_to) -> int:
  """Learner m's steps from its last progress row before `t_from` to its last before `t_to`."""
  at = lambda t: max((s for t_row, s in out["progress"][m] if t_row <= t), default=0)
  return at(t_to) - at(t_from)


def _trained_on(out, phase, start, end, learners=(0, 1)) -> None:
  """Each of `learners` made at least a quarter of its pace's steps between the phase's two
  marks (the other worker's tests share the two cores: its pace moves by half; a learner whose
  calls hold it makes a tenth)."""
  marks = out["marks"][phase]
  for m in learners:
    steps = marks[f"steps_at_{end}"][m] - marks[f"steps_at_{start}"][m]
    pace = steps / (marks[end] - marks[start])
    assert pace >= 0.25 * _pace(out, m), (phase, m, pace, _pace(out, m))


@needs_root
def test_a_learner_partitioned_past_the_absence_timeout_rejoins_and_delivers(faults):
  out, m = faults, faults["marks"]["learner_cut"]
  cut, heal = m["cut"], m["heal"]
  # Learner 1 notices within a long poll's deadline (poll 0.5 s + call 2 s) and is reachable
  # again within the longest backoff plus a call after the heal.
  _noticed(out, 1, cut, 0.5 + nf.CALL_S)
  back = nf.first_after(out["links"][1], "reachable", heal)
  assert back is not None and back <= nf.MAX_BACKOFF_S + nf.CALL_S + SLACK_S, back
  # The synchronizer declared it absent within the absence timeout (plus its 50 ms timer), and
  # learner 0 trained on, merging alone, never waiting: no gap between its merges over 1 s.
  absent = [t - cut for t in _events(out, "absent", 1) if cut <= t <= heal]
  assert absent and absent[0] <= nf.ABSENT_S + SLACK_S, absent
  _trained_on(out, "learner_cut", "cut", "heal")  # (learner 1 too, holding what it trained)
  alone = _merges(out, cut + nf.ABSENT_S + SLACK_S, heal)
  assert alone and all(r["learners"] == [0] for r in alone), alone
  times = [_wall(out, r) for r in alone]
  assert max(b - a for a, b in zip(times, times[1:])) <= 1.0, times
  # The status page and Prometheus, read during the cut: learner 1 absent, for how long.
  status = {r["learner"]: r for r in m["status"]}
  assert status[0]["live"] and status[0]["absent_s"] is None
  assert not status[1]["live"] and status[1]["absent_s"] > 0
  assert status[1]["last_seen_s"] >= nf.ABSENT_S
  lines = m["metrics"]
  assert any(l.startswith('diloco_learner_absent_seconds{learner="1"}') for l in lines), lines
  assert 'diloco_learner_live{learner="1"} 0.0' in lines
  # What it held reached merges after the heal: its share stays near a clean run's (0.98).
  assert any(1 in r["learners"] for r in _merges(out, heal, heal + 10)), "nothing of it merged"
  assert out["merged_share"]["1"] >= 0.9, out["merged_share"]


@needs_root
def test_a_learner_frozen_past_the_absence_timeout_is_left_out_and_rejoins(faults):
  out, m = faults, faults["marks"]["learner_freeze"]
  freeze, thaw = m["freeze"], m["thaw"]
  absent = [t - freeze for t in _events(out, "absent", 1) if freeze <= t <= thaw]
  assert absent and absent[0] <= nf.ABSENT_S + SLACK_S, absent
  _trained_on(out, "learner_freeze", "freeze", "thaw", learners=(0,))
  alone = _merges(out, freeze + nf.ABSENT_S + SLACK_S, thaw)
  assert alone and all(r["learners"] == [0] for r in alone), alone
  # Thawed, it finds itself left out (its calls refused or timed out) and joins again; its
  # uploads are judged by the staleness rules: merged with their staleness counted, or refused.
  later = [r for r in _merges(out, thaw, thaw + 10) if 1 in r["learners"]]
  assert later, "learner 1's work never reached a merge after it thawed"
  assert out["learner1"]["joins"] >= 3  # (the first, after the cut, after the thaw)


@needs_root
def test_a_frozen_synchronizer_resumes_without_a_restart_and_merges_nothing_twice(faults):
  out, m = faults, faults["marks"]["sync_freeze"]
  for learner in (0, 1):  # both notice within the poll's deadline and are answered again
    _noticed(out, learner, m["freeze"], 0.5 + nf.CALL_S)
    assert nf.first_after(out["links"][learner], "reachable", m["thaw"]) is not None
  _trained_on(out, "sync_freeze", "freeze", "thaw")  # (neither waits on its calls' deadlines)
  assert out["sync"]["generation"] == 0  # the same process throughout: never restarted
  # Resent uploads already merged are refused as duplicates: no learner's share passes 1.
  assert all(0.9 <= s <= 1.0 for s in out["merged_share"].values()), out["merged_share"]


@needs_root
def test_a_synchronizer_cut_off_from_every_learner_for_a_while_gets_their_work_at_the_heal(
    faults,
):
  out, m = faults, faults["marks"]["sync_cut"]
  for learner in (0, 1):
    _noticed(out, learner, m["cut"], 0.5 + nf.CALL_S)
    assert nf.first_after(out["links"][learner], "reachable", m["heal"]) is not None
  _trained_on(out, "sync_cut", "cut", "heal")
  heal = m["heal"]
  assert {0, 1} <= {l for r in _merges(out, heal, heal + 10) for l in r["learners"]}


@needs_root
def test_a_connection_cut_mid_upload_and_mid_poll_neither_hangs_nor_merges_half(faults):
  out, m = faults, faults["marks"]["half_open"]
  cut, heal = m["cut"], m["heal"]
  # Keepalive finds the silent connection on both sides within twice its interval: the
  # learner's link gives up its calls, the synchronizer drops the upload it was receiving.
  _noticed(out, 1, cut, 2 * nf.KEEPALIVE_S)
  cuts = [
      r
      for r in out["sync_rows"]
      if r.get("event") == "upload_cut" and r.get("learner") == 1 and cut <= _wall(out, r) <= heal
  ]
  assert cuts, out["sync_rows"]
  assert all(0 < r["chunks"] < r["of"] for r in cuts), cuts  # cut part-way, never merged
  _trained_on(out, "half_open", "cut", "heal", learners=(1,))
  assert _wall(out, cuts[0]) - cut <= 2 * nf.KEEPALIVE_S + SLACK_S
  assert any(1 in r["learners"] for r in _merges(out, heal, float("inf")))


@needs_root
def test_a_learner_on_a_tenth_of_the_link_it_needs_trains_on_and_its_uploads_come_late(tmp_path):
  out = nf.slow_link(str(tmp_path))  # (Decoupled; its link capped both ways for a stretch)
  _delivered(out)
  before, capped = out["rates_before"], out["rates_capped"]
  # Its steps do not wait for the link, and the other learner's do not wait for it.
  assert out["learner1"]["longest_call_s"] < 0.5 * nf.CALL_S, out["learner1"]
  assert capped[1] >= 0.5 * before[1] and capped[0] >= 0.5 * before[0], (before, capped)
  # Its uploads arrive late, not lost: what it trained while capped reaches merges by the uncap
  # and just after it, in uploads that carry at least half the capped stretch's steps, more than
  # any uncapped one (H = 8); and of each fragment fewer steps went unmerged than it trained
  # while capped: those left are the run's tail, trained after the fragment's last merge (its
  # merged share was 0.98 in a clean run, and 0.93 on a slowed machine where it trained 85 steps
  # in all and 1-10 of each fragment's were the tail; a bound of 0.95 on the share failed there).
  # (Not a multiple of the uncapped uploads: under a third pytest worker it trained fewer steps
  # in the 4 s stretch, and its largest late upload carried 23 steps against 3 x 8.)
  marks = out["marks"]

  def mine(t_from, t_to):
    return [r["steps"][r["learners"].index(1)] for r in _merges(out, t_from, t_to)
            if 1 in r["learners"]]  # fmt: skip

  uncapped, late = mine(marks["measure"], marks["cap"]), mine(marks["cap"], marks["uncap"] + 5)
  capped_steps = _steps_between(out, 1, marks["cap"], marks["uncap"])
  assert max(late) >= capped_steps / 2 and max(late) > max(uncapped), (uncapped, late, capped_steps)
  work = out["sync"]["learners"]["1"]
  unmerged = [work["trained_steps"] - n for n in work["merged_steps"].values()]
  assert max(unmerged) < capped_steps, (unmerged, capped_steps, out["merged_share"])


@needs_root
def test_synchronous_diloco_on_a_capped_link_slows_down_as_the_bandwidth_model_says(tmp_path):
  # Learner 1 capped to twice the rate its uploads used (steps not slowed: the straggle's sleep
  # would hide the wait for the link inside it). sim/bandwidth.py's hub model (the whole model up,
  # the merge down, over the cap) predicts the slowdown from the uncapped step time: 1.70 against
  # 1.62 measured on an idle machine; the suite's other worker moves step times by a fifth.
  out = nf.SCENARIOS["slow_link_sync"](str(tmp_path))
  _delivered(out)
  measured = out["rates_before"][1] / out["rates_capped"][1]
  predicted = nf.predicted_slowdown(out)["hub"]
  assert 0.75 <= measured / predicted <= 1.33, (measured, predicted, out["rates_before"])


@needs_root
def test_a_synchronizer_away_past_the_deliver_timeout_makes_learners_save_and_exit_75(tmp_path):
  out = nf.sync_away(str(tmp_path))
  assert out["codes"]["learner0"] == 75 and out["codes"]["learner1"] == 75, out["codes"]
  for m in (0, 1):
    s = out[f"learner{m}"]
    assert s["saved_at_stop"] and s["undelivered_steps"], s  # what it trained is kept, named
    assert s["steps"] == s["left_at"] > 0  # (it trained up to when it was told to finish)


def test_the_defaults_heal_a_40_s_partition_and_notice_a_dead_host_within_a_minute():
  """docs/deployment.md's WAN table, from the defaults: a learner finds a silent synchronizer
  within a long poll's deadline or two keepalive intervals; the synchronizer finds a silent
  learner after the absence timeout; a 40 s partition ends before a learner done training gives
  up (deliver_timeout_s), and after the heal the next Join comes within the longest backoff
  and gRPC's next connection attempt (at most a call's deadline apart)."""
  deploy = shakespeare.get_config("mode=decoupled").deploy
  limits = limits_lib.Limits.from_deploy(deploy)
  learner_notices = min(
      deploy.poll_wait_s + limits.deadline_s(0), 2 * deploy.keepalive_s
  )  # (whichever comes first: the poll's deadline, or keepalive dropping the connection)
  assert learner_notices == 11.0 and deploy.absent_after_s == 5.0
  assert max(learner_notices, deploy.absent_after_s) < 60
  options = dict(limits.channel_options())
  assert options["grpc.max_reconnect_backoff_ms"] == options["grpc.min_reconnect_backoff_ms"]
  reconnect_s = options["grpc.max_reconnect_backoff_ms"] / 1000  # (gRPC's own: 120 s)
  assert reconnect_s == 10.0
  assert deploy.deliver_timeout_s > 40 + nf.MAX_BACKOFF_S + reconnect_s + deploy.call_timeout_s
  # A 500 MB fragment over the floor rate (8 Mbit/s) has 510 s before its upload gives up.
  assert limits.deadline_s(500e6) == 510.0
