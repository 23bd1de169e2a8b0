"""The merge clock's study: its sweep file's points and configs, and its tables' verdicts on rows
worked out by hand."""

import math

import pytest

from configs.sweeps import merge_clock as mc
from experiments.studies import merge_clock_table as mt


def _row(lr, loss, seed=0, **cell):
  return dict(outer_lr=lr, eval_loss=loss, seed=seed, **cell)


def test_the_sweep_builds_each_study_as_documented():
  a = mc.get_config("study=a,learners=16,clock=period,scale=tokens,outer_lr=0.2")
  # 8,000 learner steps' tokens over 16 learners: 500 steps each; half of them 18% slower.
  assert (a.steps, a.outer.learners, a.outer.lr) == (500, 16, 0.2)
  assert a.sim.speeds == ",".join(["1"] * 8 + ["1.18"] * 8)
  assert (a.outer.merge_clock, a.outer.merge_scale, a.outer.quorum, a.outer.delivery) == (
      "period",
      "tokens",
      1,
      "rebase",
  )
  wait = mc.get_config("study=a,learners=8,policy=wait_all")
  assert wait.outer.quorum == 8 and wait.outer.blocking
  d = mc.get_config("study=d,clock=period,outer_lr=0.2")
  assert (d.outer.learners, d.sim.speeds, d.outer.lr) == (2, "1,3", 0.2)
  assert mc.get_config("study=d,method=diloco").mode == "diloco"
  with pytest.raises(ValueError, match="expected a pair"):
    mc.get_config("study=a,clock=period,scale=half")
  # Study c's K = 1 with grace at M = 8 is study a's M = 8 point (one run, one directory).
  a8 = [p for p in mc.get_sweep("study=a") if p["learners"] == 8]
  c8 = [p for p in mc.get_sweep("study=c") if p["policy"] == "k1_grace"]
  assert a8 == c8 and len(a8) == 4 * len(mc.GRID)
  tiny = mc.get_sweep("study=a,tiny")
  assert {p["learners"] for p in tiny} == {4, 8} and {p["outer_lr"] for p in tiny} == {0.1}
  # Scavenging with one rate for every row and seed: the preset's 0.1, or the one named.
  preset = mc.get_sweep("study=b,part=preset,pairs=period/one,seeds=2")
  assert len(preset) == 5 * 2 and {p["outer_lr"] for p in preset} == {0.1}
  assert {p["extra"] for p in preset} == {0, 1, 2, 4, 12} and {p["seed"] for p in preset} == {0, 1}
  # Waiting for all (by arrival only) keeps to the pairs named, as every cell does.
  waits = mc.get_sweep("study=c,policies=wait_all,pairs=arrival/tokens,rates=0.4,part=tune")
  assert [(p["policy"], p["clock"], p["scale"]) for p in waits] == [
      ("wait_all", "arrival", "tokens")
  ]
  named = mc.get_sweep("study=b,part=preset,pairs=period/one,rates=0.2")
  assert len(named) == 15 and {p["outer_lr"] for p in named} == {0.2}
  # Several pairs are joined by '+' (',' separates variants); a pair not run is refused.
  two = mc.get_sweep("study=a,studies_m=16,pairs=arrival/tokens+period/tokens,rates=0.4")
  assert [(p["clock"], p["scale"]) for p in two] == [("arrival", "tokens"), ("period", "tokens")]
  with pytest.raises(ValueError, match="not among"):
    mc.get_sweep("study=a,pairs=period/half")
  assert mc.get_sweep("study=d,part=baseline,seeds=2") == [
      dict(study="d", method="diloco", seed=0),
      dict(study="d", method="diloco", seed=1),
  ]


def test_invariance_counts_the_rungs_the_winner_moves():
  rows = []
  # arrival/one: M = 2 wins at 0.2, M = 8 at 0.05: two rungs apart. period/tokens: 0.2 at both.
  for m, losses in ((2, {0.05: 2.1, 0.1: 2.0, 0.2: 1.9}), (8, {0.05: 1.8, 0.1: 1.85, 0.2: 1.9})):
    for lr, loss in losses.items():
      rows.append(_row(lr, loss, learners=m, clock="arrival", scale="one"))
  for m in (2, 8):
    for lr, loss in {0.1: 2.0, 0.2: 1.7}.items():
      rows.append(_row(lr, loss, learners=m, clock="period", scale="tokens"))
  rows.append(_row(0.2, 1.8, seed=1, learners=8, clock="period", scale="tokens"))
  table = {r["pair"]: r for r in mt.invariance(rows, (2, 8))}
  assert table["arrival/one"]["rungs"] == 2.0
  assert table["period/tokens"]["rungs"] == 0.0
  # M = 8 under period/tokens: seeds 1.7 and 1.8 at 0.2: mean 1.75, half-range 0.05, 2 seeds.
  lr, mu, hr, n = table["period/tokens"]["per_m"][8]
  assert (lr, n) == (0.2, 2) and mu == pytest.approx(1.75) and hr == pytest.approx(0.05)
  text = mt.invariance_text(mt.invariance(rows, (2, 8, 16)), (2, 8, 16))
  assert "not run" in text and "0.2: 1.7500 ±0.0500 (2)" in text


def test_one_rate_for_every_m_is_the_one_of_least_worst_excess():
  rows = []
  # arrival/one: M = 2 best 1.9 at 0.2, M = 8 best 1.8 at 0.05. At 0.05 the worst excess is
  # M = 2's 2.1 - 1.9 = 0.2; at 0.1: max(2.0 - 1.9, 1.85 - 1.8) = 0.1 (M = 2); at 0.2:
  # 1.95 - 1.8 = 0.15 (M = 8). period/one: 0.4 at M = 2 only, left out of its choice.
  for m, losses in ((2, {0.05: 2.1, 0.1: 2.0, 0.2: 1.9}), (8, {0.05: 1.8, 0.1: 1.85, 0.2: 1.95})):
    for lr, loss in losses.items():
      rows.append(_row(lr, loss, learners=m, clock="arrival", scale="one"))
  for m, losses in ((2, {0.2: 1.95, 0.4: 1.7}), (8, {0.2: 1.82})):
    for lr, loss in losses.items():
      rows.append(_row(lr, loss, learners=m, clock="period", scale="one"))
  rows.append(_row(0.2, 1.0, seed=1, learners=8, clock="period", scale="one"))  # (not seed 0)
  got = mt.one_rate(rows, (2, 8))
  assert got["arrival/one"] == (0.1, pytest.approx(0.1), 2)
  # period/one: 0.2 is the one rate run at both: excess 1.95 - 1.7 = 0.25 at M = 2, 0 at M = 8.
  assert got["period/one"] == (0.2, pytest.approx(0.25), 2)
  assert "period/tokens" not in got and mt.one_rate(rows, (2, 4)) == {}


def test_grace_verdicts():
  rows = [
      _row(0.4, 1.90, policy="wait_all", clock="arrival", scale="one"),
      _row(0.4, 1.92, seed=1, policy="wait_all", clock="arrival", scale="one"),
      # arrival/one: K = 1 1.95 ±0.01 (worse than waiting, 1.91 ±0.01), grace 1.91: recovers.
      _row(0.05, 1.94, policy="k1", clock="arrival", scale="one"),
      _row(0.05, 1.96, seed=1, policy="k1", clock="arrival", scale="one"),
      _row(0.1, 1.91, policy="k1_grace", clock="arrival", scale="one"),
      # period/one: grace no better than K = 1 alone (within the spread).
      _row(0.2, 1.95, policy="k1", clock="period", scale="one"),
      _row(0.2, 1.96, policy="k1_grace", clock="period", scale="one"),
  ]
  verdicts = dict(mt.grace_verdicts(rows))
  assert verdicts["arrival/one"].startswith("SHOWN")
  assert verdicts["period/one"].startswith("NOT SHOWN")
  assert verdicts["arrival/tokens"] == "not run"
  assert mt.gap((2.70, 0.01, 3), (2.675, 0.005, 3)) == pytest.approx(2.70 / 2.675 - 1)
  assert math.isnan(mt.stats([])[0])


def test_scavenging_at_each_rows_own_rate():
  """period/one: the 4-learner run wins at 0.2 (final 2.0, reached at t = 10), the +2 row at
  0.4; the +2 row's curve at 0.4 reaches 2.0 at t = 8, halfway between its evaluations at 6
  (2.2) and 10 (1.8): 0.8 of the 4-learner time. The rows at the losing rates are not used."""
  curve = lambda *pts: [dict(sim_time_s=t, eval_loss=l) for t, l in pts]
  pair = dict(clock="period", scale="one")
  rows = [
      _row(0.2, 2.0, extra=0, eval_curve=curve((5, 2.5), (10, 2.0)), **pair),
      _row(0.4, 2.1, extra=0, eval_curve=curve((5, 2.4), (10, 2.1)), **pair),
      _row(0.2, 1.9, extra=2, eval_curve=curve((6, 2.1), (10, 1.9)), **pair),
      _row(0.4, 1.8, extra=2, eval_curve=curve((6, 2.2), (10, 1.8)), **pair),
  ]
  got = mt.tuned_scavenging(rows)
  assert list(got) == [("period", "one")]
  t = got[("period", "one")]
  assert t["rates"] == {0: 0.2, 2: 0.4} and t["losses"][2] == (1.8, 0.0, 1)
  assert t["times"][0] == [1.0] and t["times"][2] == [pytest.approx(0.8)]
