"""The delivery-rule table's cells and verdicts, on rows made up by hand."""

import json

import pytest

from configs.sweeps import delivery as dv
from experiments.studies import delivery_table as dt


def _row(policy, delivery, lr, seed, loss, share=0.5, budget=None):
  r = dict(setting="paper", domain="text", policy=policy, delivery=delivery, outer_lr=lr)
  r.update(seed=seed, eval_loss=loss, merged_share=share, goodput=1.0, mean_quorum=2.0)
  return r if budget is None else dict(r, budget=budget)


ROWS = [
    # replace: 0.4 wins at seed 0 (2.0 < 2.1); seeds 2.0, 2.2, 2.1 -> 2.1 ± 0.1
    _row("k1_grace", "replace", 0.2, 0, 2.1),
    _row("k1_grace", "replace", 0.4, 0, 2.0, 0.4),
    _row("k1_grace", "replace", 0.4, 1, 2.2, 0.4),
    _row("k1_grace", "replace", 0.4, 2, 2.1, 0.4),
    # rebase: 0.2 wins; 1.8, 1.9 -> 1.85 ± 0.05: better than 2.1 by 0.25 > 0.1
    _row("k1_grace", "rebase", 0.2, 0, 1.8, 0.9),
    _row("k1_grace", "rebase", 0.2, 1, 1.9, 0.9),
    _row("k1_grace", "rebase", 0.4, 0, 1.95, 0.9),
    # at_own_sync: 2.05 at 0.4 and 2.25 -> 2.15 ± 0.1: within replace's spread
    _row("k1_grace", "at_own_sync", 0.4, 0, 2.05, 0.6),
    _row("k1_grace", "at_own_sync", 0.4, 1, 2.25, 0.6),
    # an equal-time row at rebase's winner, and one at a rate that did not win (left out)
    _row("k1_grace", "rebase", 0.2, 0, 1.7, 0.95, budget="time"),
    _row("k1_grace", "rebase", 0.4, 0, 1.6, 0.95, budget="time"),
]


def test_cells_are_at_their_own_winners_and_time_rows_at_the_same_rate():
  tokens, time = dt.cells(ROWS, "tokens"), dt.cells(ROWS, "time")
  replace = tokens[("paper", "text", "k1_grace", "replace")]
  assert replace.outer_lr == 0.4 and replace.seeds == 3
  assert (
      abs(replace.mean("eval_loss") - 2.1) < 1e-12
      and abs(replace.spread("eval_loss") - 0.1) < 1e-12
  )
  assert tokens[("paper", "text", "k1_grace", "rebase")].outer_lr == 0.2
  assert list(time) == [("paper", "text", "k1_grace", "rebase")]
  assert time[("paper", "text", "k1_grace", "rebase")].values("eval_loss") == (1.7,)


def test_each_keeping_rule_against_replace_by_hand():
  found = dt.findings(dt.cells(ROWS), ("k1_grace",), dv.DELIVERIES, "tokens")
  verdicts = {claim.split(": ")[1]: verdict for claim, verdict, _ in found}
  assert verdicts == {
      "rebase against replace": "better",
      "at_own_sync against replace": "within the seed spread",
  }
  numbers = {claim.split(": ")[1]: n for claim, _, n in found}
  assert numbers["rebase against replace"].endswith("merged share 0.90 vs 0.40")


def test_the_grace_claim_needs_all_three_policies_and_reads_them():
  rows = [
      _row(p, "rebase", 0.4, 0, loss)
      for p, loss in (("wait_all", 2.0), ("k1", 2.2), ("k1_grace", 1.9))
  ]
  (claim, verdict, _), *_ = dt.findings(
      dt.cells(rows), ("wait_all", "k1", "k1_grace"), ("rebase",), "tokens"
  )
  assert "K=1 with grace at least as good" in claim and verdict == "shown"
  rows[2] = _row("k1_grace", "rebase", 0.4, 0, 2.1)  # grace now worse than waiting
  (_, verdict, _), *_ = dt.findings(
      dt.cells(rows), ("wait_all", "k1", "k1_grace"), ("rebase",), "tokens"
  )
  assert verdict == "not shown"


def test_the_sweep_points_and_the_equal_time_by_hand():
  # 4 learners, two twice as slow: 1 + 1 + 1/2 + 1/2 = 3 steps per second, 40 steps in 40/3 s.
  assert abs(dv.equal_time_s((1, 1, 2, 2), 10, 1.0) - 40 / 3) < 1e-12
  tune = dv.get_sweep("part=tune")
  assert len(tune) == 2 * 3 * 3 * 3  # domains x policies x rules x rates, the paper setting
  assert {p["delivery"] for p in tune} == set(dv.DELIVERIES)
  c = dv.get_config("budget=time,setting=2x,delivery=at_own_sync")
  assert c.sim.speeds == "1,1,1,1,2,2,2,2" and c.outer.delivery == "at_own_sync"
  assert abs(c.sim.time_limit_s - 8 * 1000 / 6) < 1e-9
  assert dv.get_config("").sim.time_limit_s == 0.0  # equal tokens: no time limit


def test_the_rda_points_hold_every_learner_count_policy_and_merge():
  points = dv.get_sweep("part=rda,delivery=rebase")
  cells = {(p["learners"], p["policy"], p["merge"]) for p in points}
  assert len(cells) == 8 and len(points) == 8 * 3 and {p["delivery"] for p in points} == {"rebase"}
  c = dv.get_config("learners=16,policy=wait_all,merge=mean")
  assert (c.outer.learners, c.outer.quorum, c.outer.merge) == (16, 16, "mean")
  assert c.sim.speeds.split(",") == ["1", "1", "1", "1"] + ["1.18"] * 4 + ["1"] * 4 + ["1.18"] * 4


def test_extend_adds_rungs_past_an_edge_winner():
  rows = [
      _row("k1_grace", "rebase", lr, 0, loss) for lr, loss in ((0.2, 3.0), (0.4, 4.0), (0.8, 9.0))
  ]
  rows += [
      _row("k1_grace", "replace", lr, 0, loss) for lr, loss in ((0.2, 2.1), (0.4, 2.0), (0.8, 2.2))
  ]
  cells = [("paper", "text", "k1_grace", d) for d in ("replace", "rebase")]
  got = [(p["delivery"], p["outer_lr"]) for p in dv._extend(rows, cells, 2)]
  assert got == [("rebase", 0.1), ("rebase", 0.05)]  # replace's winner 0.4 is inside its grid


def test_rda_points_reuse_point_3s_rows_and_scale_their_rates(tmp_path):
  # Point 3's rebase rows at the paper setting are point 4's (M = 8, rda) cells: the tune skips
  # the two rates they hold, and the seeds stage takes their winner (0.05) and their seed 1.
  rows = [
      dict(_row("k1_grace", "rebase", lr, seed, loss), name=f"p3-{lr}-{seed}", status="done")
      for lr, seed, loss in ((0.025, 0, 2.0), (0.05, 0, 1.9), (0.05, 1, 1.95))
  ]
  (tmp_path / "tune_text.jsonl").write_text("".join(f"{json.dumps(r)}\n" for r in rows))
  arg = f"delivery=rebase,policies=k1_grace,lr_scale=0.125,results={tmp_path}"
  tune = {(p["learners"], p["merge"], p["outer_lr"]) for p in dv.get_sweep(f"part=rda,{arg}")}
  assert (8, "rda", 0.1) in tune and (8, "rda", 0.05) not in tune and (8, "rda", 0.025) not in tune
  assert len(tune) == 4 * 3 - 2 and {lr for *_, lr in tune} == {0.025, 0.05, 0.1}
  with pytest.raises(ValueError, match="no finished seed-0 rows"):  # the other cells: not tuned
    dv.get_sweep(f"part=rda_seeds,{arg}")
  assert dv.get_sweep(f"part=rda_extend,{arg}") == [
      dict(learners=8, policy="k1_grace", merge="rda", delivery="rebase", outer_lr=0.1, seed=0)
  ]
  # point 4's own rows share the workdir; point 3's stages read past them
  rda = dict(learners=16, policy="k1_grace", merge="mean", delivery="rebase", outer_lr=0.05)
  rda.update(seed=0, eval_loss=1.8, name="p4", status="done")
  (tmp_path / "rda.jsonl").write_text(json.dumps(rda) + "\n")
  extend = dv.get_sweep(f"part=extend,domains=text,policies=k1_grace,results={tmp_path}")
  assert [(p["delivery"], p["outer_lr"]) for p in extend] == [("rebase", 0.1)]
  # a point of point 4's own stays listed (its stage's table keeps it; the sweep skips the run)
  again = {(p["learners"], p["merge"], p["outer_lr"]) for p in dv.get_sweep(f"part=rda,{arg}")}
  assert (16, "mean", 0.05) in again and again == tune


def test_rda_against_the_mean_by_hand():
  def r(m, policy, merge, lr, seed, loss, quorum=2.0):
    return dict(learners=m, policy=policy, merge=merge, delivery="rebase", outer_lr=lr, seed=seed)

  rows = [
      # M = 16, waiting: rda wins at 0.4 (1.90, 1.92 -> 1.91 ± 0.01), the mean at 0.2 (1.95, 1.97)
      dict(r(16, "wait_all", "rda", 0.4, 0, 0), eval_loss=1.90, mean_quorum=16.0),
      dict(r(16, "wait_all", "rda", 0.4, 1, 0), eval_loss=1.92, mean_quorum=16.0),
      dict(r(16, "wait_all", "rda", 0.2, 0, 0), eval_loss=1.99, mean_quorum=16.0),
      dict(r(16, "wait_all", "mean", 0.2, 0, 0), eval_loss=1.95, mean_quorum=16.0),
      dict(r(16, "wait_all", "mean", 0.2, 1, 0), eval_loss=1.97, mean_quorum=16.0),
  ]
  # a point 3 row is the (8, k1_grace, rda) cell; an other rule's row is left out
  p3 = _row("k1_grace", "rebase", 0.05, 0, 1.93)
  got = dt.rda_rows(rows + [p3, _row("k1_grace", "replace", 0.2, 0, 1.96)], "rebase")
  assert len(got) == 6 and dict(p3, learners=8, merge="rda") in got
  table = dt.rda_cells(got)
  assert table[(16, "wait_all", "rda")].outer_lr == 0.4 and table[(8, "k1_grace", "rda")].seeds == 1
  ((claim, verdict, numbers),) = dt.rda_findings(table)  # (8, k1_grace) has no mean cell
  assert claim == "M = 16, wait_all: RDA against the mean" and verdict == "better"  # 0.05 > 0.01
  assert numbers.startswith("1.9100 (±0.0100, 2 seeds) at lr 0.4 vs 1.9600 (±0.0100, 2 seeds)")
