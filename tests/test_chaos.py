"""Fault schedules and the integrity checks, without training: a hand-made model and hand numbers.

Each rejection test snapshots the synchronizer's durable state (its sha256 digest, plus the global
parameters and outer optimizer state compared bit for bit) before a bad message and checks it after.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest

from diloco.chaos import schedule as chaos
from diloco.outer import fragments, integrity, optimizers, policies
from diloco.outer.codecs import compression
from diloco.outer.sync import screening, sync_state
from diloco.outer.learner.learner import Learner
from diloco.outer.outcomes import Code
from diloco.outer.protocol import Join, Log, Send, Upload, records
from diloco.outer.sync.synchronizer import Synchronizer

F32 = np.float32
PARAMS = {
    "embed": {"embedding": np.array([[1.0, 2.0], [3.0, 4.0]], F32)},
    "blocks": {
        0: {"w": np.array([[0.5, -1.0], [2.0, 0.25]], F32)},
        1: {"w": np.array([1.0, -2.0, 4.0], F32)},
    },
    "final_norm": {"scale": np.array([1.0, 1.0], F32)},
}
FRAG = fragments.strided(PARAMS, 2)  # 0: embed, block 0; 1: block 1, final norm
E, W0, W1, S = "embed/embedding", "blocks/0/w", "blocks/1/w", "final_norm/scale"
K1 = policies.Policy(
    policies.MinQuorum(1),
    policies.NoGrace(),
    weights=policies.EqualWeights(),
    merge=policies.Mean(),
)


# ---- schedules ----


def test_hand_written_lines_parse_to_faults_and_back():
  text = """
    crash learner 2 at t=300s for 120s   # the issue's example
    straggle learner 1 at t=50s for 100s x3; delay learner 0 at t=20s for 60s +5s
    partition learner 0 at t=10s for 30s drop
    corrupt learner 3 at t=80s down
    poison learner 1 at t=90s huge x1e3
    sync_crash at t=200s for 20s save
    """
  faults = chaos.parse(text)
  assert [f.time_s for f in faults] == [10, 20, 50, 80, 90, 200, 300]  # sorted by time
  by_kind = {f.kind: f for f in faults}
  assert by_kind["crash"] == chaos.Fault(300.0, "crash", 2, 120.0)
  assert (by_kind["straggle"].factor, by_kind["straggle"].end_s) == (3.0, 150.0)
  assert (by_kind["delay"].learner, by_kind["delay"].factor) == (0, 5.0)
  assert by_kind["partition"].mode == "drop" and by_kind["corrupt"].mode == "down"
  assert (by_kind["poison"].mode, by_kind["poison"].factor) == ("huge", 1000.0)
  assert by_kind["sync_crash"] == chaos.Fault(200.0, "sync_crash", None, 20.0, mode="save")
  # Defaults: corrupt uploads, poison with NaN, partitions hold, straggle x2.
  assert chaos.parse_line("corrupt learner 0 at t=1s").mode == "up"
  assert chaos.parse_line("poison learner 0 at t=1s").mode == "nan"
  assert chaos.parse_line("partition learner 0 at t=1s for 2s").mode == "hold"
  assert chaos.parse_line("straggle learner 0 at t=1s for 2s").factor == 2.0
  assert chaos.parse(chaos.format_schedule(faults)) == faults


@pytest.mark.parametrize(
    "line, why",
    [
        ("explode learner 1 at t=5s for 1s", "unknown fault kind"),
        ("crash learner 1 at t=5s", "needs a duration"),
        ("crash at t=5s for 1s", "needs a learner"),
        ("sync_crash learner 1 at t=5s for 1s", "takes no learner"),
        ("crash learner 1 for 3s", "missing 'at t="),
        ("straggle learner 1 at t=5s for 10s x0.5", "factor must be >= 1"),
        ("partition learner 0 at t=1s for 2s sideways", "unexpected 'sideways'"),
        ("corrupt learner 0 at t=1s for 2s", "takes no duration"),
        ("crash learner one at t=5s for 1s", "unexpected 'learner'"),
    ],
)
def test_bad_lines_fail_naming_the_line(line, why):
  with pytest.raises(ValueError) as err:
    chaos.parse(f"crash learner 0 at t=1s for 1s; {line}")
  assert repr(line) in str(err.value) and why in str(err.value)


def test_generated_schedules_are_seeded_and_poisson():
  a = chaos.generate(
      7, learners=3, horizon_s=1000.0, mtbf_s=50.0, recovery_s=10.0, sync_mtbf_s=200.0
  )
  assert a == chaos.generate(
      7, learners=3, horizon_s=1000.0, mtbf_s=50.0, recovery_s=10.0, sync_mtbf_s=200.0
  )
  assert a != chaos.generate(
      8, learners=3, horizon_s=1000.0, mtbf_s=50.0, recovery_s=10.0, sync_mtbf_s=200.0
  )
  assert {f.kind for f in a} == set(chaos.KINDS)
  for m in range(3):  # a learner's next fault is drawn after its previous one ends
    mine = [f for f in a if f.learner == m]
    assert all(x.end_s <= y.time_s for x, y in zip(mine, mine[1:]))
  # Faults without duration: arrivals are exactly a Poisson process of rate 1/mtbf, so the count
  # over 10,000 s at mtbf 10 s is Poisson(1000) per learner: within 4 sigma (126) of 1000.
  b = chaos.generate(0, learners=2, horizon_s=10_000.0, mtbf_s=10.0, kinds=("corrupt",))
  for m in range(2):
    gaps = np.diff([0.0] + [f.time_s for f in b if f.learner == m])
    assert abs(len(gaps) - 1000) < 4 * math.sqrt(1000)
    assert abs(gaps.mean() - 10.0) < 4 * 10.0 / math.sqrt(1000)


def test_recovery_distributions():
  rng = np.random.default_rng(0)
  assert chaos.draw_duration(rng, 30.0, "fixed") == 30.0
  u = [chaos.draw_duration(rng, 30.0, "uniform") for _ in range(2000)]
  assert 15.0 <= min(u) and max(u) <= 45.0
  e = [chaos.draw_duration(rng, 30.0, "exp") for _ in range(20_000)]
  assert abs(np.mean(e) - 30.0) < 4 * 30.0 / math.sqrt(20_000)
  with pytest.raises(ValueError, match="unknown recovery distribution"):
    chaos.draw_duration(rng, 30.0, "weibull")


def _chaos_cfg(**kw):
  import ml_collections

  base = dict(
      schedule="none",
      seed=0,
      mtbf_s=0.0,
      recovery_s=0.0,
      recovery_dist="exp",
      sync_mtbf_s=-1.0,
      kinds="",
  )
  return ml_collections.ConfigDict({**base, **kw})


def test_from_config_presets_files_and_errors(tmp_path):
  assert chaos.from_config(_chaos_cfg(), 4, 100.0) == []
  heavy = chaos.from_config(_chaos_cfg(schedule="heavy", seed=1), 4, 1000.0)
  # heavy: per-learner mtbf 0.25 x the run, recovery 5% of it, the synchronizer every half run;
  # drawn over 4x the run (a run slowed by faults meets them to its end).
  assert chaos.SPAN == 4.0
  assert heavy == chaos.generate(1, 4, 4000.0, 250.0, chaos.LEARNER_KINDS, 50.0, "exp", 500.0)
  # Drawing further adds faults after the nominal end and changes none before it.
  nominal = chaos.generate(1, 4, 1000.0, 250.0, chaos.LEARNER_KINDS, 50.0, "exp", 500.0)
  assert [f for f in heavy if f.time_s < 1000.0] == nominal
  assert max(f.time_s for f in heavy) > 3000.0 and len(heavy) > 2 * len(nominal)
  light = chaos.from_config(_chaos_cfg(schedule="light", kinds="crash", mtbf_s=100.0), 2, 1000.0)
  assert {f.kind for f in light} == {"crash"} and len(light) > 3
  path = tmp_path / "faults.txt"
  path.write_text("crash learner 1 at t=5s for 2s\n# nothing else\n")
  assert chaos.from_config(_chaos_cfg(schedule=str(path)), 2, 10.0) == [
      chaos.Fault(5.0, "crash", 1, 2.0)
  ]
  inline = chaos.from_config(
      _chaos_cfg(schedule="crash learner 1 at t=5s for 2s; sync_crash at t=1s for 1s"), 2, 10.0
  )
  assert [f.kind for f in inline] == ["sync_crash", "crash"]
  with pytest.raises(ValueError, match="names learner 3 of 2"):
    chaos.from_config(_chaos_cfg(schedule="crash learner 3 at t=5s for 2s"), 2, 10.0)
  with pytest.raises(ValueError, match="no such file"):
    chaos.from_config(_chaos_cfg(schedule=str(tmp_path / "missing.txt")), 2, 10.0)


# ---- messages: checksums, bit flips, poison ----


def _enc(values: dict) -> dict:
  return compression.encode_tree(values, "fp32")


def _up(m, p, delta, base, *, steps=1, tokens=8, gen=0, time=1.0) -> Upload:
  return Upload(m, p, base, _enc(delta), steps, tokens, time, time, 1.0, base_generation=gen)


def _delta(p: int, scale: float = 0.25) -> dict:
  return {k: np.full(x.shape, scale, F32) for k, x in fragments.extract(PARAMS, FRAG, p).items()}


def test_checksums_are_computed_by_the_sender_and_catch_flipped_bits():
  up = _up(0, 0, _delta(0), 0)
  assert up.checksum_ok()
  # Times are not covered (they are stamped on arrival); payload and header numbers are.
  assert dataclasses.replace(up, time=9.0).checksum_ok()
  assert not dataclasses.replace(up, steps=2).checksum_ok()
  flipped = dataclasses.replace(up, delta=chaos.flip_bits(up.delta, np.random.default_rng(0)))
  assert not flipped.checksum_ok()
  changed = [k for k in up.delta if flipped.delta[k].payload != up.delta[k].payload]
  assert len(changed) == 1
  diff = np.frombuffer(flipped.delta[changed[0]].payload, np.uint8) ^ np.frombuffer(
      up.delta[changed[0]].payload, np.uint8
  )
  assert 1 <= np.count_nonzero(diff) <= 8
  send = Send(1, 0, 3, values=fragments.extract(PARAMS, FRAG, 0))
  assert send.checksum_ok()
  bad = dataclasses.replace(send, values=chaos.flip_bits(send.values, np.random.default_rng(1)))
  assert not bad.checksum_ok()


def test_poisoned_payloads_bypass_the_encoders_finite_check():
  delta = _enc({"a": np.array([0.5, -0.25, 1.0, 2.0], F32)})
  nan = compression.decode(chaos.poison(delta, "nan", 0)["a"])
  inf = compression.decode(chaos.poison(delta, "inf", 0)["a"])
  huge = compression.decode(chaos.poison(delta, "huge", 1e6)["a"])
  assert np.isnan(nan).sum() >= 1 and np.isinf(inf).sum() >= 1
  np.testing.assert_array_equal(huge, np.array([0.5, -0.25, 1.0, 2.0], F32) * F32(1e6))
  with pytest.raises(ValueError):
    compression.encode(nan, "fp32")  # what an honest encoder would refuse


# ---- the synchronizer refuses, and nothing changes ----


def _sync(learners=2, screen=None, tx=None) -> Synchronizer:
  sync = Synchronizer(PARAMS, FRAG, K1, tx or optimizers.nesterov(0.5, 0.5), screen=screen)
  for m in range(learners):
    sync.handle(Join(m, 0.0, (0, 0)))
  return sync


def _bits(sync: Synchronizer):
  return (
      {k: v.copy() for k, v in sync.global_params().items()},
      [np.array(x) for x in jax.tree.leaves([f.opt_state for f in sync.fragments.values()])],
      sync.state_dict(),
  )


def _assert_same_bits(before, sync: Synchronizer, screened: bool = False) -> None:
  """Globals and outer optimizer state bit for bit, then the whole durable state (its digest);
  `screened`: except the outlier screen's norm history, which remembers outliers on purpose."""
  g0, opt0, state0 = before
  g1, opt1, state1 = _bits(sync)
  assert sorted(g0) == sorted(g1)
  for k in g0:
    np.testing.assert_array_equal(g0[k].view(np.uint32), g1[k].view(np.uint32))
  for a, b in zip(opt0, opt1, strict=True):
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
  if screened:
    assert len(state1["meta"]["norms"][0]) == len(state0["meta"]["norms"][0]) + 1
    for state in (state0, state1):
      state["meta"] = {k: v for k, v in state["meta"].items() if k not in ("norms", "rms")}
  assert sync_state.digest(state0) == sync_state.digest(state1)


def _warm(sync: Synchronizer, rounds: int = 4) -> None:
  """`rounds` merges of fragment 0 by learner 0 (momentum, versions and norm history move)."""
  for v in range(rounds):
    sync.handle(_up(0, 0, _delta(0, 0.25 + 0.125 * (v % 2)), v))


def _raw(values: np.ndarray) -> compression.Encoded:
  x = np.asarray(values, F32)
  return compression.Encoded("fp32", x.shape, x.tobytes(), compression.DEFAULT_BLOCK)


@pytest.mark.parametrize(
    "case, code, reason",
    [
        ("corrupted payload", "checksum", "checksum mismatch"),
        ("NaN update", "non_finite", "non-finite values"),
        ("Inf update", "non_finite", "non-finite values"),
        ("huge update", "outlier", "outlier: norm"),
        ("wrong shape", "shape", "embed/embedding has shape (2, 3), expected (2, 2)"),
        ("unknown fragment", "unknown_fragment", "unknown fragment 7"),
        ("future version", "unknown_base_version", "unknown base version 5 (current 4)"),
        ("unknown generation", "unknown_base_version", "of generation 3, now 0"),
        ("already merged", "duplicate", "already contributed to fragment 0 on base version 3"),
    ],
)
def test_every_bad_upload_is_rejected_with_its_reason_and_changes_nothing(case, code, reason):
  sync = _sync(screen=integrity.OutlierScreen(factor=100.0, min_history=4))
  _warm(sync)
  assert sync.versions == [4, 0]
  good = _up(1, 0, _delta(0), 4)
  bad = {
      "corrupted payload": dataclasses.replace(
          good, delta=chaos.flip_bits(good.delta, np.random.default_rng(2))
      ),
      "NaN update": dataclasses.replace(
          good, delta=chaos.poison(good.delta, "nan", 0), checksum=None
      ),
      "Inf update": dataclasses.replace(
          good, delta=chaos.poison(good.delta, "inf", 0), checksum=None
      ),
      "huge update": dataclasses.replace(
          good, delta=chaos.poison(good.delta, "huge", 1e6), checksum=None
      ),
      "wrong shape": dataclasses.replace(
          good, delta={**good.delta, E: _raw(np.zeros((2, 3)))}, checksum=None
      ),
      "unknown fragment": dataclasses.replace(good, fragment=7, checksum=None),
      "future version": dataclasses.replace(good, base_version=5, checksum=None),
      "unknown generation": dataclasses.replace(good, base_generation=3, checksum=None),
      "already merged": _up(0, 0, _delta(0), 3),
  }[case]
  before = _bits(sync)
  logs = records(sync.handle(bad))
  assert [(r["event"], r["learner"], r["code"]) for r in logs] == [("reject", bad.learner, code)]
  assert reason in logs[0]["reason"] and logs[0]["sent_time"] == bad.sent_time
  _assert_same_bits(before, sync, screened=code == "outlier")
  assert sync.pending == [{}, {}] and sync.versions == [4, 0]
  # The same learner's next honest upload merges normally.
  (merge,) = records(sync.handle(good))
  assert merge["event"] == "merge" and merge["learners"] == [1] and sync.versions == [5, 0]


def test_outlier_screen_limits_by_hand():
  screen = integrity.OutlierScreen(factor=10.0, min_history=3, window=4)
  # The very first upload of a run, alone: compared with itself (sqrt(9) x RMS 2/3 = 2).
  assert screen.limit([], [], 9, [2.0]) == pytest.approx(20.0)
  # Fragment history too short: sqrt(9) x lower median RMS of recent ones and this round's
  # (0.5, 1, 2 and 3/3: lower median 1).
  assert screen.limit([1.0], [0.5, 1.0, 2.0], 9, [3.0]) == 30.0
  assert screen.limit([1.0, 2.0, 3.0], [], 9, [4.0]) == 20.0  # 1, 2, 3, 4: lower median 2
  # The last 4 of the history (2, 3, 100, 4) and the round's 5: median 4.
  assert screen.limit([1.0, 2.0, 3.0, 100.0, 4.0], [], 9, [5.0]) == 40.0
  # One honest and one poisoned upload, no history: the lower median is the honest one's.
  assert screen.limit([], [], 4, [1.0, 1e6]) == 10.0 * 2.0 * 0.5
  # Zero norms (a step at learning rate 0) set no scale: 1 and 2 against RMS 0.5 (sqrt 4 = 2).
  assert screen.limit([0.0, 0.0], [0.0, 0.5], 4, [0.0]) == 10.0 * 2.0 * 0.5
  assert screen.limit([0.0], [0.0], 4, [0.0]) == math.inf
  assert screen.remember([1.0, 2.0, 3.0], [4.0, 5.0]) == [2.0, 3.0, 4.0, 5.0]
  assert integrity.lower_median([3.0, 1.0, 2.0, 10.0]) == 2.0
  with pytest.raises(ValueError, match="factor must be > 1"):
    integrity.OutlierScreen(factor=1.0)


def test_screen_round_by_hand():
  """Three deltas of a 4-value fragment, no history: norms 1, 1e6 and a NaN. The limit is
  10 x sqrt(4) x the lower median RMS (0.5, 5e5) = 10, the clipping norm 10/10 x 0.5 = 0.5."""
  screen = integrity.OutlierScreen(factor=10.0, min_history=4, window=4, clip_factor=0.5)
  deltas = [
      {"w": np.full(4, 0.5, np.float32)},
      {"w": np.full(4, 5e5, np.float32)},
      {"w": np.array([np.nan, 0, 0, 0], np.float32)},
  ]
  v = screening.screen_round(deltas, 4, screen, [], [])
  assert v.rejected == {
      1: (Code.OUTLIER, "outlier: norm 1e+06 above the limit 10"),
      2: (Code.NON_FINITE, "non-finite values"),
  }
  assert v.scale == {0: 0.5}  # norm 1 clipped to 0.5
  # The outlier enters the history too (norms in float32: 1e6 to 7 digits).
  assert v.norms == pytest.approx([1.0, 1e6], rel=1e-6) and v.rms == pytest.approx([0.5, 5e5])


def test_an_upload_carrying_more_steps_than_h_may_be_as_many_times_the_limit():
  """H = 8, a history of norms 1 (limit 10 x 1): an upload of 72 steps (9 H) may reach 90, one
  of 8 steps or fewer only 10. A learner back from an outage with 72 steps of one fragment was
  refused as an outlier and lost them (tests/test_learner_process.py's restart, 2 runs in 5 under
  load); the clip (2 x 1) is the same for every upload."""
  screen = integrity.OutlierScreen(factor=10.0, min_history=4, window=4, clip_factor=2.0, period=8)
  deltas = [{"w": np.full(4, x / 2, np.float32)} for x in (50.0, 50.0, 95.0, 4.0)]  # norms
  v = screening.screen_round(deltas, 4, screen, [1.0] * 4, [], steps=[72, 8, 72, 4])
  assert v.rejected == {
      1: (Code.OUTLIER, "outlier: norm 50 above the limit 10"),
      2: (Code.OUTLIER, "outlier: norm 95 above the limit 90"),
  }
  assert v.scale == {0: 2.0 / 50.0, 3: 0.5}  # both clipped to 2
  assert [screen.allowance(k) for k in (0, 8, 12, 72)] == [1.0, 1.0, 1.5, 9.0]
  assert integrity.OutlierScreen(factor=10.0).allowance(72) == 1.0  # period 0: none
  with pytest.raises(ValueError, match="period must be >= 0"):
    integrity.OutlierScreen(period=-1)


def test_outliers_enter_the_history_so_a_general_rise_is_followed():
  """Learners' norms x1000 (a warm-up ending): rejected until they are half of the window."""
  sync = _sync(screen=integrity.OutlierScreen(factor=100.0, min_history=2, window=4))
  small, big = 2.0**-10, 2.0**-10 * 1000
  for v in range(2):
    sync.handle(_up(0, 0, _delta(0, small), v))
  codes = []
  for v in range(4):
    logs = records(sync.handle(_up(0, 0, _delta(0, big), sync.versions[0])))
    codes.append(logs[0].get("code", logs[0]["event"]))
  # With this round's norm: [s, s, B] -> lower median s: reject; [s, s, B, B] -> s: reject;
  # [s, s, B, B, B] -> B: accepted, and from then on.
  assert codes == ["outlier", "outlier", "merge", "merge"]


def test_an_outer_gradient_above_the_clip_is_scaled_down_to_it():
  """Clip 4 x the lower median norm: the second upload (norm 80 against a median of 5, limit
  20) is merged at 20/80 = 1/4 of itself, and its learner is named in the merge record."""
  screen = integrity.OutlierScreen(factor=100.0, min_history=1, window=16, clip_factor=4.0)
  sync = _sync(screen=screen, tx=optimizers.sgd(1.0))  # outer SGD lr 1: globals -= merged
  zero = {E: np.zeros((2, 2), F32), W0: np.zeros((2, 2), F32)}
  d0 = {
      **zero,
      E: np.array([[3.0, 0.0], [0.0, 0.0]], F32),
      W0: np.array([[0.0, 4.0], [0.0, 0.0]], F32),
  }  # norm 5: alone, compared with itself
  d1 = {
      E: np.array([[0.0, 48.0], [0.0, 0.0]], F32),
      W0: np.array([[0.0, 0.0], [64.0, 0.0]], F32),
  }  # norm 80; median of 5 and 80 is 5
  (m0,) = [a.record for a in sync.handle(_up(0, 0, d0, 0)) if isinstance(a, Log)]
  assert m0["clipped"] == []
  (m1,) = [a.record for a in sync.handle(_up(1, 0, d1, 1)) if isinstance(a, Log)]
  assert m1["event"] == "merge" and m1["clipped"] == [1]
  got = sync.global_params()
  np.testing.assert_array_equal(got[E], PARAMS["embed"]["embedding"] - d0[E] - d1[E] / 4)
  np.testing.assert_array_equal(got[W0], PARAMS["blocks"][0]["w"] - d0[W0] - d1[W0] / 4)
  with pytest.raises(ValueError, match="clip factor must be in"):
    integrity.OutlierScreen(factor=10.0, clip_factor=10.0)


def test_state_dict_round_trips_and_wrong_states_are_refused():
  sync = _sync(screen=integrity.OutlierScreen())
  _warm(sync, 3)
  state = sync.state_dict()
  other = _sync(learners=0, screen=integrity.OutlierScreen())
  assert other.digest() != sync.digest()
  other.load_state_dict(state)
  assert other.digest() == sync.digest() and other.versions == [3, 0]
  assert other.live == set() and other.members == {0, 1}
  # The restored one continues bit for bit like the original.
  for s in (sync, other):
    s.handle(Join(0, 1.0, (3, 0)))
    s.handle(_up(0, 0, _delta(0), 3))
  assert other.digest() == sync.digest()
  bad = {"arrays": {**state["arrays"], "global.0.0": np.zeros((3, 3), F32)}, "meta": state["meta"]}
  with pytest.raises(ValueError, match=r"global.0.0: float32\(3, 3\), expected float32\(2, 2\)"):
    other.load_state_dict(bad)
  with pytest.raises(ValueError, match="arrays"):
    other.load_state_dict(
        {"arrays": {"versions": state["arrays"]["versions"]}, "meta": state["meta"]}
    )


def test_a_restart_keeps_the_history_up_to_its_checkpoint_and_forgets_the_rest():
  sync = _sync(tx=optimizers.sgd(1.0))
  _warm(sync, 2)  # fragment 0 at version 2
  saved = sync.state_dict()
  _warm_more = [sync.handle(_up(1, 0, _delta(0), v)) for v in (2, 3)]  # to version 4, then lost
  del _warm_more
  restarted = _sync(learners=0, tx=optimizers.sgd(1.0))
  restarted.restart(saved, generation=1)
  assert restarted.generation == 1 and restarted.lineage == {0: [2, 0]}
  assert restarted.versions == [2, 0]

  def logs(actions):
    return [(r["event"], r.get("code")) for r in records(actions)]

  # Learner 0 held (gen 0, v2 / v0): the same as the checkpoint, so nothing is sent to it.
  assert restarted.handle(Join(0, 5.0, (2, 0), (0, 0))) == [
      Log({"event": "join", "learner": 0, "time": 5.0})
  ]
  # Learner 1 held (gen 0, v4): merged after the checkpoint and lost: the full v2 comes back.
  sends = [a for a in restarted.handle(Join(1, 5.0, (4, 0), (0, 0))) if isinstance(a, Send)]
  assert [(s.fragment, s.version, s.generation, s.update) for s in sends] == [(0, 2, 1, None)]
  # Uploads on generation 0 versions up to the checkpoint are known; later ones are refused.
  assert logs(restarted.handle(_up(1, 0, _delta(0), 3, gen=0))) == [
      ("reject", "unknown_base_version")
  ]
  assert logs(restarted.handle(_up(0, 0, _delta(0), 2, gen=0))) == [("merge", None)]
  assert restarted.versions == [3, 0]
  # A generation-1 version 3 and a generation-0 version 3 are different histories.
  assert logs(restarted.handle(_up(1, 0, _delta(0), 3, gen=1))) == [("merge", None)]
  # A second restart from the same checkpoint: generation 1 shares versions <= 2 too.
  again = _sync(learners=0, tx=optimizers.sgd(1.0))
  again.restart(saved, generation=2)
  assert again.lineage == {0: [2, 0], 1: [2, 0]}
  with pytest.raises(ValueError, match="must exceed"):
    again.restart(saved, generation=0)


def _learner() -> Learner:
  sched = fragments.Schedule(2, 4)
  learner = Learner(0, None, FRAG, sched, "fp32", 0.0, 8, state="not used here")
  learner.global_copy = [fragments.extract(PARAMS, FRAG, p) for p in range(2)]
  learner.versions, learner.generations = [3, 0], [1, 0]
  learner.sync_generations = [1]
  return learner


def test_a_learner_applies_only_intact_sends_based_on_what_it_holds():
  learner = _learner()
  upd = _enc(_delta(0))

  def update(version, base_gen=1, gen=1):
    return Send(0, 0, version, update=upd, generation=gen, base_generation=base_gen)

  def full(version, gen):
    return Send(0, 0, version, values=fragments.extract(PARAMS, FRAG, 0), generation=gen)

  assert learner.accepts(update(4)) is None  # holds (gen 1, v3): v4 applies
  assert learner.accepts(update(5)) == "gap"  # v4 was lost on the way
  assert learner.accepts(update(3)) == "duplicate"
  assert learner.accepts(update(4, base_gen=0)) == "gap"  # based on another history's v3
  assert learner.accepts(update(4, gen=0, base_gen=0)) == "old_generation"
  assert learner.accepts(full(4, 1)) is None and learner.accepts(full(3, 1)) == "duplicate"
  assert learner.accepts(full(1, 2)) is None  # a restarted synchronizer's older version wins
  bad = dataclasses.replace(update(4), update=chaos.flip_bits(upd, np.random.default_rng(3)))
  assert learner.accepts(bad) == "checksum"
  # Receiving full values of generation 2 moves what it holds and what it listens to.
  learner.receive = Learner.receive.__get__(learner)
  learner._write = lambda values: None  # no device state in this test
  learner.receive(full(1, 2))
  assert (learner.versions[0], learner.generations[0], learner.sync_generations) == (1, 2, [2])
  assert learner.accepts(update(5)) == "old_generation"
  np.testing.assert_array_equal(learner.global_copy[0][E], PARAMS["embed"]["embedding"])


def test_an_upload_carries_the_generation_of_its_base():
  learner = _learner()
  learner._read = lambda p: {k: v - 0.5 for k, v in learner.global_copy[p].items()}
  learner.c_steps, learner.c_tokens = [2, 2], [16, 16]
  up = learner.upload(0, sent_time=1.0, arrival_time=1.5, step_time=1.0)
  assert (up.base_version, up.base_generation, up.steps) == (3, 1, 2) and up.checksum_ok()
  np.testing.assert_array_equal(compression.decode(up.delta[W0]), np.full((2, 2), 0.5, F32))
