"""The merge clock and scale (outer.merge_clock, outer.merge_scale): merge times and members under
`period` and `arrival` from given upload times, a restart's phase, a sharded synchronizer's own
schedules, a merge's share of an outer step; numbers worked out by hand."""

import dataclasses
import hashlib
import json

import numpy as np
import pytest
from proc_helpers import read_jsonl

from configs import shakespeare
from diloco import train
from diloco.outer import fragments, optimizers, policies
from diloco.outer.codecs import compression
from diloco.outer.sync import merge_clock
from diloco.outer.protocol import Join, Log, SetTimer, Tick, Upload
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.rpc import local
from diloco.runners import islands as islands_lib
from diloco.runtime import sync_host
from diloco.sweeps import sweep

F32 = np.float32
PARAMS = {"blocks": {0: {"w": np.array([1.0, 2.0], F32)}, 1: {"w": np.array([4.0], F32)}}}
W0, W1 = "blocks/0/w", "blocks/1/w"
H = 4  # inner steps per period; learner 0 takes 1 s a step, learner 1 3 s


def _sync(clock="period", scale="one", frags=1, quorum=1, grace=None, owned=None, tx=None):
  policy = policies.Policy(
      policies.MinQuorum(quorum),
      grace or policies.NoGrace(),
      policies.EqualWeights(),
      policies.Mean(),
      ema_decay=0.5,
      merge_clock=clock,
      merge_scale=scale,
      clock_steps=H,
  )
  frag = fragments.strided(PARAMS, frags)
  sync = Synchronizer(PARAMS, frag, policy, tx or optimizers.sgd(1.0), owned=owned)
  for m in range(2):
    sync.handle(Join(m, 0.0, (0,) * frags))
  return sync


def _up(m: int, t: float, base: int, frags: int = 1, p: int = 0, delta=0.5, steps: int = H):
  """Learner m's upload of fragment p (of `frags`) at t: 8 tokens a step, its step time 1 s
  (m=0) or 3 s."""
  keys = fragments.strided(PARAMS, frags).paths[p]
  enc = compression.encode_tree({k: np.full(2 if k == W0 else 1, delta, F32) for k in keys}, "fp32")
  return Upload(m, p, base, enc, steps, 8 * steps, t, t, 1.0 if m == 0 else 3.0)


class Driver:
  """Feeds events in time order, firing the timers the synchronizer asks for in between (as
  every runtime does); keeps the merges (time, fragment, members, share, period)."""

  def __init__(self, sync: Synchronizer):
    self.sync, self.timers, self.merges = sync, [], []

  def _act(self, actions):
    for a in actions:
      if isinstance(a, SetTimer):
        self.timers.append(a.time)
      elif isinstance(a, Log) and a.record["event"] == "merge":
        r = a.record
        self.merges.append((r["time"], r["fragment"], r["learners"], r["scale"], r["period_s"]))

  def until(self, t: float):
    while self.timers and min(self.timers) <= t:
      due = min(self.timers)
      self.timers.remove(due)
      self._act(self.sync.handle(Tick(due)))

  def upload(self, m: int, t: float, p: int = 0, **kw):
    self.until(t)
    held = self.sync.held[m][p]  # against the version it holds, as a learner uploads
    frags = self.sync.frag.num_fragments
    self._act(self.sync.handle(_up(m, t, kw.pop("base", held), frags, p, **kw)))


def _schedule(d: Driver):
  """Learner 0 uploads at 4, 7.5, 11.5 and 17; learner 1 (3x slower) at 10."""
  for m, t in ((0, 4.0), (0, 7.5), (1, 10.0), (0, 11.5), (0, 17.0)):
    d.upload(m, t)
  d.until(100.0)


def test_period_merges_on_the_schedule_with_every_upload_since_the_last():
  d = Driver(_sync("period"))
  _schedule(d)
  # 4: the first merge is the arrival rule's (quorum 1, no grace): the period is H x the
  #    fastest learner's step time, 4 x 1 s, so the next is due at 8.
  # 7.5: learner 0 waits for 8 (a timer); at 8 it merges alone and the next is due at 12.
  # 10, 11.5: learner 1 waits; learner 0 joins it and every live learner is in before 12: the
  #    round merges at 11.5 with both, and the schedule stays (next due 12 + 4 = 16).
  # 17: nothing had arrived by 16, so the merge waits for the K-th upload and (no grace) merges
  #    at once; the next is due at 21.
  assert [(t, m) for t, _, m, _, _ in d.merges] == [
      (4.0, [0]),
      (8.0, [0]),
      (11.5, [0, 1]),
      (17.0, [0]),
  ]
  assert [t for *_, t in d.merges] == [4.0] * 4  # learner 0's EMA stays 1 s
  assert d.sync.clock.due[0] == 21.0


def test_arrival_merges_every_upload_as_before():
  d = Driver(_sync("arrival"))
  _schedule(d)
  assert [(t, m) for t, _, m, _, _ in d.merges] == [
      (4.0, [0]),
      (7.5, [0]),
      (10.0, [1]),
      (11.5, [0]),
      (17.0, [0]),
  ]
  assert not d.timers and d.sync.clock.due_at(0) is None
  assert not d.sync.clock.stateful and "clock" not in d.sync.state_dict()["meta"]


def test_merges_per_period_in_the_summary():
  # period: merges at 4, 8, 11.5, 17, a period of 4 s: 3 intervals over 13 s = 3.25 periods.
  # arrival: 4, 7.5, 10, 11.5, 17: 4 intervals over the same 3.25 periods.
  for clock, want in (("period", 3 / 3.25), ("arrival", 4 / 3.25)):
    d = Driver(_sync(clock))
    _schedule(d)
    got = d.sync.merge_clock_summary()
    assert got["clock"] == clock and got["scale"] == "one"
    assert got["merges_per_period"] == {"0": pytest.approx(want)}


def test_period_late_quorum_opens_the_grace_window_from_the_schedule():
  # Grace γ(τ·ξ_step − ξ_quorum − ξ_sync) with γ = 1, τ = 2. First merge at 4 (learner 0 at 4:
  # quorum at once, ξ_quorum = 0, ξ_step = 1, ξ_sync = 0: grace 2 s, learner 1 not in: a window
  # to 6, merged at 6 with learner 0 alone). Next due 6 + 4 = 10. Learner 0 at 10.5 is late: the
  # quorum is reached 0.5 s after the schedule (ξ_quorum = 0.5·0 + 0.5·0.5 = 0.25), grace
  # 2·1 − 0.25 = 1.75 s; learner 1 comes at 11 within it and makes everyone: merged at 11.
  d = Driver(_sync("period", grace=policies.AdaptiveGrace(1.0, 2)))
  d.upload(0, 4.0)
  d.upload(0, 10.5)
  d.upload(1, 11.0)
  d.until(100.0)
  assert [(t, m) for t, _, m, _, _ in d.merges] == [(6.0, [0]), (11.0, [0, 1])]
  assert d.sync.ema_quorum.get() == pytest.approx(0.25)
  assert d.sync.clock.due[0] == pytest.approx(15.0)


def test_a_restart_keeps_the_phase():
  sync = _sync("period")
  d = Driver(sync)
  d.upload(0, 4.0)
  d.upload(0, 7.5)
  d.until(8.0)  # merged at 8: next due at 12
  state = sync.state_dict()
  assert state["meta"]["clock"]["due"] == [[0, 12.0, 4.0]]
  # Restarted before the due time: learner 0's upload at 10 waits for 12, as before.
  again = _sync("period")
  again.restart(state, 1)
  d2 = Driver(again)
  for m in range(2):
    d2._act(again.handle(Join(m, 9.0, tuple(sync.versions))))
  d2.upload(0, 10.0)
  d2.until(100.0)
  assert [(t, m) for t, _, m, _, _ in d2.merges] == [(12.0, [0])]
  # Down past two scheduled times (12, 16): at 17.5 the schedule moves on by whole periods, to
  # 20, and learner 0's upload at 18 waits for it.
  late = _sync("period")
  late.restart(state, 1)
  d3 = Driver(late)
  for m in range(2):
    d3._act(late.handle(Join(m, 17.5, tuple(sync.versions))))
  assert late.clock.due[0] == 20.0
  d3.upload(0, 18.0)
  d3.until(100.0)
  assert [(t, m) for t, _, m, _, _ in d3.merges] == [(20.0, [0])]


def test_a_restart_on_a_clock_that_started_again_keeps_stagger_and_period():
  # A new synchronizer process counts from 0: a checkpoint whose last merge was at 8, fragment 0
  # due at 12, resumes at its first event (1.0 on the new clock) with 12 − 8 = 4 s to go: due
  # at 5.
  sync = _sync("period")
  d = Driver(sync)
  d.upload(0, 4.0)
  d.upload(0, 7.5)
  d.until(8.0)
  sync.handle(Tick(9.0))
  state = sync.state_dict()
  fresh = _sync("period")
  fresh.restart(state, 1)
  fresh.handle(Join(0, 1.0, tuple(sync.versions)))
  assert fresh.clock.due[0] == 5.0 and fresh.clock.period[0] == 4.0


def test_each_shard_keeps_its_own_schedule():
  # Two shards of a two-fragment model, fragment 1 uploaded 2 s after fragment 0 (the
  # learners' stagger, H/P = 2): shard A's first merge at 4 sets 8, shard B's at 6 sets 10.
  shards = [_sync("period", frags=2, owned=[p]) for p in (0, 1)]
  drivers = [Driver(s) for s in shards]
  for t0 in (4.0, 7.0):
    drivers[0].upload(0, t0, p=0)
    drivers[1].upload(0, t0 + 2.0, p=1)
  for d in drivers:
    d.until(100.0)
  assert [(t, p) for t, p, *_ in drivers[0].merges] == [(4.0, 0), (8.0, 0)]
  assert [(t, p) for t, p, *_ in drivers[1].merges] == [(6.0, 1), (10.0, 1)]
  # Shard B restarts alone: its schedule comes back, shard A's is untouched.
  state = shards[1].state_dict()
  shards[1].restart(state, 1)
  shards[1].handle(Join(0, 11.0, tuple(shards[1].versions)))
  assert shards[1].clock.due == {1: 14.0} and shards[0].clock.due == {0: 12.0}


def test_token_share_of_an_outer_step():
  # Full round at K = 1: reference 1 s (learner 0); each learner's H steps' tokens times its
  # share of a reference period: 4·8·1 + 4·8·(1/3) = 42.67. Learner 0 alone (32 tokens) takes
  # 0.75 of an outer step: SGD lr 1 moves w by 0.75 · 0.5; both (64) take a whole one.
  d = Driver(_sync("arrival", scale="tokens"))
  d.upload(0, 1.0, steps=H)  # (only learner 0 is measured: its own round, share 1)
  d.upload(1, 2.0)  # learner 1 alone: 32 / 42.67
  assert [s for *_, s, _ in d.merges] == [1.0, pytest.approx(0.75)]
  np.testing.assert_allclose(d.sync.global_params()[W0], [1.0 - 0.5 - 0.375, 2.0 - 0.875])
  np.testing.assert_allclose(d.sync.global_params()[W1], [4.0 - 0.875])
  assert d.sync.state_dict()["meta"]["clock"]["scale"] == "tokens"


def test_scale_one_under_arrival_is_the_outer_step_as_before():
  # The same upload through a synchronizer without the merge clock's knobs, and with them at
  # their defaults: the same bits (Nesterov, lr 0.7).
  bare = policies.Policy(
      policies.MinQuorum(1), policies.NoGrace(), policies.EqualWeights(), policies.Mean(), 0.5
  )
  plain = Synchronizer(PARAMS, fragments.strided(PARAMS, 1), bare, optimizers.nesterov(0.7, 0.9))
  for m in range(2):
    plain.handle(Join(m, 0.0, (0,)))
  ours = _sync("arrival", tx=optimizers.nesterov(0.7, 0.9))
  for s in (plain, ours):
    s.handle(_up(0, 1.0, 0, delta=0.3))
    s.handle(_up(0, 2.0, 1, delta=-0.2))
  assert plain.digest() == ours.digest()


def test_fractional_nesterov_by_hand():
  # lr 0.7, μ 0.9, g = 0.5, share 0.5 twice from m = 0:
  # m1 = 0.9^0.5·0 + 0.25 = 0.25, step 0.7·0.5·(0.5 + 0.9·0.25) = 0.25375;
  # m2 = 0.9^0.5·0.25 + 0.25 = 0.487171, step 0.7·0.5·(0.5 + 0.9·0.487171) = 0.328459.
  # Together 0.582209, against one whole step 0.7·(0.5 + 0.9·0.5) = 0.665: the momentum is
  # taken in by halves. At share 1 it is optax's step.
  tx = optimizers.nesterov(0.7, 0.9)
  params = {"w": np.array([1.0], F32)}
  state = tx.init(params)
  g = {"w": np.array([0.5], F32)}
  zero = {"w": np.zeros(1, F32)}
  up1, state = optimizers.fractional_step(tx, g, state, zero, 0.5)
  up2, state = optimizers.fractional_step(tx, g, state, zero, 0.5)
  np.testing.assert_allclose([up1["w"][0], up2["w"][0]], [-0.25375, -0.328459], rtol=1e-5)
  whole, _ = optimizers.fractional_step(tx, g, tx.init(params), zero, 1.0)
  ref, _ = optimizers.reference_step(tx, g, tx.init(params), params, zero)
  np.testing.assert_allclose(whole["w"], ref["w"], rtol=1e-6)
  with pytest.raises(ValueError, match="needs nesterov or sgd"):
    optimizers.fractional_step(optimizers.delayed_nesterov(0.7, 0.9, 2), g, state, zero, 0.5)
  with pytest.raises(ValueError, match="in \\(0, 1\\]"):
    optimizers.fractional_step(tx, g, state, zero, 0.0)


def test_bad_clock_or_scale_names_the_key():
  with pytest.raises(ValueError, match="outer.merge_clock 'sometimes'"):
    _sync("sometimes")
  with pytest.raises(ValueError, match="outer.merge_scale 'half'"):
    _sync("period", scale="half")


def _hosted(clock: str):
  """A synchronizer in the real-time host on a clock the test sets (its timer thread fires the
  scheduled merges when the clock passes them); the merge records it logged."""
  now, merges = [0.0], []
  host = sync_host.SyncHost(
      _sync(clock),
      absent_after_s=1e9,
      clock=lambda: now[0],
      on_log=lambda r: merges.append(r) if r["event"] == "merge" else None,
  )
  for m in range(2):
    host.join(m, f"s{m}", (0,))
  return host, now, merges


def _wait_merges(host, merges: list, n: int) -> None:
  """Until the host has logged n merges (its timer thread wakes every 50 ms of real time)."""
  with host.cond:
    assert host.cond.wait_for(lambda: len(merges) >= n, timeout=30.0), merges


@pytest.mark.parametrize("clock", ["period", "arrival"])
def test_the_real_time_host_merges_at_the_stated_times(clock):
  # The upload times of `_schedule` through SyncHost: the same merges, times and members as on
  # the virtual clock (the scheduled ones fired by the host's timer thread).
  host, now, merges = _hosted(clock)
  want = {
      "period": [(4.0, [0]), (8.0, [0]), (11.5, [0, 1]), (17.0, [0])],
      "arrival": [(4.0, [0]), (7.5, [0]), (10.0, [1]), (11.5, [0]), (17.0, [0])],
  }[clock]
  timers = {"period": [8.0], "arrival": []}[clock]  # merges no upload sets off
  try:
    for m, t in ((0, 4.0), (0, 7.5), (1, 10.0), (0, 11.5), (0, 17.0)):
      for w in [w for w in timers if now[0] < w < t]:  # the clock reaches it first
        now[0] = w
        _wait_merges(host, merges, sum(x <= w for x, _ in want))
      now[0] = t
      host.upload(m, f"s{m}", _up(m, t, host.sync.held[m][0]))
    _wait_merges(host, merges, len(want))
  finally:
    host.close()
  assert [(r["time"], r["learners"]) for r in merges] == want
  assert {r["clock"] for r in merges} == {clock}


GRPC = "configs/shakespeare.py:mode=decoupled,runlocal,learners=2,steps={steps}"


def _grpc_run(tmp_path, clock: str, steps: int = 96) -> tuple[dict, list[dict]]:
  """A synchronizer and two learner processes under `clock`, learner 1 straggling x3, `steps`
  each: the synchronizer's `merge_clock` summary and its merge records."""
  overrides = (
      f"--config.outer.merge_clock={clock}",
      "--config.chaos.schedule=straggle learner 1 at t=0s for 1000000s x3",
      "--config.outer.learner_checkpoint_every=0",
      "--config.progress_bar=False",
  )
  c = local.LocalCluster(GRPC.format(steps=steps), 2, str(tmp_path / clock), overrides=overrides)
  try:
    c.start()
    assert c.wait(240) == {"sync": 0, "learner0": 0, "learner1": 0}
  finally:
    c.stop(grace_s=2.0)
  with open(tmp_path / clock / "sync" / "summary.json") as f:
    summary = json.load(f)["merge_clock"]
  rows = read_jsonl(str(tmp_path / clock / "sync" / "metrics.jsonl"))
  return summary, [r for r in rows if r.get("event") == "merge"]


def test_grpc_processes_with_a_learner_3x_slower_keep_the_period(tmp_path):
  # A synchronizer and two learner processes (runlocal: P = 4, H = 8, K = 1 with grace), learner
  # 1 straggling x3 (after it measured its own pace), both training 96 steps under the period
  # clock: every merge but each fragment's first kept its scheduled time or had both learners
  # in, and a fragment merges at most about once per period (n merges span at least n - 2
  # periods; 1.25 leaves room for the pace's EMA moving). (How many merges each clock makes is
  # compared on the virtual clock above: two learner processes on two loaded cores do not keep
  # a 3x pace; the arrival clock through the same processes is the next test.)
  period, period_merges = _grpc_run(tmp_path, "period")
  assert period["clock"] == "period" and len(period["merges_per_period"]) == 4
  assert max(period["merges_per_period"].values()) <= 1.25, period
  assert period_merges and all(r["clock"] == "period" for r in period_merges)
  for r in period_merges:
    assert r["due_s"] is None or r["time"] >= r["due_s"] or len(r["learners"]) == 2, r
  print(f"period: {len(period_merges)} merges, per period {period['merges_per_period']}")


def test_grpc_processes_with_a_learner_3x_slower_merge_each_round_their_arrivals_open(tmp_path):
  # The same processes under the arrival clock, with today's count: each merge is a round its
  # first upload opened (K = 1: the quorum met on arrival, `time - grace_s` is that arrival),
  # holding every upload of the fragment that arrived until it merged, and the next round opens
  # at the next arrival. So each fragment merges once per such round, whatever the period: the
  # count the code before the merge clock made (on the virtual clock, bit for bit, above).
  summary, merges = _grpc_run(tmp_path, "arrival", steps=48)  # (6 uploads of each fragment each)
  assert summary["clock"] == "arrival" and merges
  assert all(r["clock"] == "arrival" and r["due_s"] is None for r in merges)
  for p in range(4):
    rows = [r for r in merges if r["fragment"] == p]
    for r in rows:
      assert r["time"] - r["grace_s"] == pytest.approx(min(r["arrived"]), abs=1e-6), r
    for r, nxt in zip(rows, rows[1:]):
      assert min(nxt["arrived"]) >= r["time"], (r, nxt)
  both = sum(len(r["learners"]) == 2 for r in merges)
  print(f"arrival: {len(merges)} merges, {both} with both learners, {summary['merges_per_period']}")


def test_the_pace_is_measured_between_arrivals():
  # Learner 0 reports 1 s a step (the step alone). Its uploads at steps 4, 8, 12 arrive at 4.5,
  # 9.5, 13.5: the first interval, 5 s over 4 steps, replaces the report (1.25 s); the next
  # (1.0 s) is averaged in at decay 0.5: 1.125 s, what the period is made of (H = 4: 4.5 s).
  pace = merge_clock.Pace(0.5)
  for step, t in ((4, 4.5), (8, 9.5), (12, 13.5)):
    up = _up(0, t, 0)
    pace.observe(dataclasses.replace(up, step=step, checksum=up.checksum))
    if step == 4:
      assert pace.step_s[0].get() == 1.0
    if step == 8:
      assert pace.step_s[0].get() == 1.25
  assert pace.step_s[0].get() == 1.125 and pace.measured == {0}
  assert pace.reference_s({0, 1}, policies.MinQuorum(1)) == 1.125
  # A process that restarted behind its last upload (step 10 after 12): no interval taken.
  up = _up(0, 20.0, 0)
  pace.observe(dataclasses.replace(up, step=10, checksum=up.checksum))
  assert pace.step_s[0].get() == 1.125
  restored = merge_clock.Pace(0.5)
  restored.load(pace.state())
  assert restored.step_s[0].get() == 1.125 and restored.measured == {0} and not restored.last


BEFORE_THE_MERGE_CLOCK = "83843b45d40aa03be0aa8b561b9a9542a578f90d257b80c6246d0f370088793d"


def _virtual_merges(tmp_path, clock: str) -> tuple[list, dict]:
  """A tiny Decoupled run on the virtual clock (3 learners at speeds 1, 1.18 and 3, 10%
  jitter, the Decoupled preset's outer rate before the merge clock, 0.1): its merges (time,
  fragment, learners, version) and its summary."""
  c = shakespeare.get_config("mode=decoupled,runlocal,learners=3,steps=48")
  c.sim.speeds, c.sim.step_jitter, c.outer.merge_clock = "1,1.18,3", 0.1, clock
  c.outer.lr = 0.1
  summary = islands_lib.run(c, str(tmp_path / clock))
  rows = read_jsonl(str(tmp_path / clock / "metrics.jsonl"))
  merges = [
      (round(r["time"], 9), r["fragment"], r["learners"], r["version"])
      for r in rows
      if r.get("event") == "merge"
  ]
  return merges, summary


def test_arrival_merges_as_before_the_merge_clock_and_period_keeps_its_bound(tmp_path):
  # The arrival schedule's digest was computed once with the code before the merge clock
  # (commit dc19a52, the same run): 47 merges, the first of fragment 1 at 3.5185 s with
  # learners 0 and 1. Times and members do not depend on the CPU's last bits; the parameters
  # do, on this machine's CPU and the suite's XLA flags (BENCHMARKS.md, "Determinism"): dc19a52
  # ended this run, under tests/conftest.py's flags, with the same params_sha256, computed
  # there once (2026-12-07) and pinned.
  merges, run = _virtual_merges(tmp_path, "arrival")
  digest = hashlib.sha256(json.dumps(merges).encode()).hexdigest()
  assert len(merges) == 47 and merges[0] == (3.518513266, 1, [0, 1], 1)
  assert digest == "23709694e5466364c5f090d1a4a86c9bc7ca88604ecc7dc76742732991e01e45"
  assert run["params_sha256"] == BEFORE_THE_MERGE_CLOCK
  summary = run["merge_clock"]
  assert summary["clock"] == "arrival" and summary["mean_merges_per_period"] > 1.2
  # The same run by the period clock: fewer merges, at most about one per fragment per period.
  period, run = _virtual_merges(tmp_path, "period")
  summary = run["merge_clock"]
  assert len(period) < len(merges)
  assert max(summary["merges_per_period"].values()) <= 1.1, summary


# The study sweeps whose checked-in tables were run under the arrival clock (the Decoupled
# preset's until issue 69): each names it, so that its command still makes its table.
ARRIVAL_STUDIES = (
    "ablations", "ablations_regime", "async", "delivery", "heterogeneous", "scavenging",
)  # fmt: skip


@pytest.mark.parametrize("name", ARRIVAL_STUDIES)
def test_the_studies_made_under_the_arrival_clock_name_it(name):
  points = sweep.points(f"configs/sweeps/{name}.py:tiny=1")
  decoupled = [p.config for p in points if p.config.mode == "decoupled"]
  assert decoupled and all(c.outer.merge_clock == "arrival" for c in decoupled), name


def test_the_scaling_laws_decoupled_column_names_the_arrival_clock():
  # (its sweep builds points only from a results workdir: the run config it builds them from)
  from configs import scaling_laws

  config = scaling_laws.run_config("method=decoupled,size=t1,tiny=1", ())
  assert config.mode == "decoupled" and config.outer.merge_clock == "arrival"


@pytest.mark.parametrize(
    "keys,message",
    [
        (dict(merge_clock="sometimes"), "outer.merge_clock='sometimes'"),
        (dict(merge_scale="half"), "outer.merge_scale='half'"),
        (dict(merge_clock="period", blocking=True), "outer.merge_clock=period with blocking"),
        (
            dict(merge_scale="tokens", optimizer="delayed_nesterov"),
            "outer.merge_scale=tokens with outer.optimizer=delayed_nesterov",
        ),
    ],
)
def test_a_bad_clock_or_scale_is_refused_before_a_run_naming_the_key(tmp_path, keys, message):
  config = shakespeare.get_config("mode=decoupled,runlocal")
  for k, v in keys.items():
    sweep.set_from_text(config, f"outer.{k}", str(v))
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()  # nothing was written
