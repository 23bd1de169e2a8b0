"""The scaling-laws study under the paper's protocol: its run config (configs/scaling_laws.py),
its winners and edges (experiments/studies/scaling_protocol.py) and its four stage files, on rows
written by hand."""

import json

import pytest

from configs import scaling_laws
from configs.sweeps import scaling_inner, scaling_outer, scaling_overtrain, scaling_seeds
from diloco.config import shape_check
from experiments.studies import scaling_protocol as sp


@pytest.mark.parametrize("size", ["xs", "s", "m", "l", "t1", "t2"])
def test_sizes_have_the_parameter_counts_the_budget_is_computed_from(size):
  tiny = size.startswith("t")
  c = scaling_laws.get_config(f"size={size},tiny={tiny}")
  d, layers, heads, n = scaling_laws.sizes(tiny)[size]
  assert shape_check.param_count(c) == n
  assert (c.model.d_model, c.model.num_layers, c.model.num_heads) == (d, layers, heads)
  assert d // heads == (16 if size == "xs" else 32) or tiny  # heads of 32 dims but the smallest


def test_budget_is_20_bytes_per_parameter_split_over_the_learners():
  # s: 20 x 28,960 = 579,200 bytes; batch 8 x 64 = 512 bytes a step: 1,131.25 -> 1,131 steps
  c = scaling_laws.get_config("size=s,method=diloco,learners=4,batch=8,lr=0.01")
  assert (c.steps, c.batch_size, c.seq_len, c.outer.learners) == (1131, 2, 64, 4)
  assert (c.optimizer.lr, c.optimizer.warmup_steps, c.optimizer.decay_steps) == (0.01, 56, 1075)
  assert (c.outer.inner_steps, c.outer.lr, c.outer.momentum) == (30, 0.6, 0.9)
  assert (c.optimizer.b2, c.optimizer.min_lr_ratio, c.model.qk_norm) == (0.99, 0.05, True)
  # m at 4x: 80 x 139,904 / (32 x 64) = 5,464.9 -> 5,465; dp trains the whole batch
  dp = scaling_laws.get_config("size=m,method=dp,batch=32,overtrain=4")
  assert (dp.steps, dp.batch_size, dp.outer.learners) == (5465, 32, 1)
  with pytest.raises(ValueError, match="does not split over 8 learners"):
    scaling_laws.get_config("method=diloco,learners=8,batch=4")


def _row(size, method, lr, batch, loss, seed=0, outer_lr=0.6, overtrain=1):
  return {**sp.point(size, method, lr, batch, seed, outer_lr, overtrain), "eval_loss": loss}


ROWS = [  # size s, dp: best at the smallest rate and batch tried (two edges)
    _row("s", "dp", 0.014142, 8, 2.00),
    _row("s", "dp", 0.02, 8, 2.02),
    _row("s", "dp", 0.014142, 16, 2.05),
    _row("s", "dp", 0.02, 16, 2.07),
    # M = 8: best at the middle rate and the smallest batch, which is M: nothing to extend
    _row("s", 8, 0.014142, 8, 2.30),
    _row("s", 8, 0.02, 8, 2.20),
    _row("s", 8, 0.028284, 8, 2.25),
    _row("s", 8, 0.02, 16, 2.40),
    # stage (b) of M = 8 at its winner (0.02, 8): 0.8 wins; a run off the winner does not count
    _row("s", 8, 0.02, 8, 2.10, outer_lr=0.8),
    _row("s", 8, 0.02, 8, 2.15, outer_lr=1.0),
    _row("s", 8, 0.02, 16, 1.00, outer_lr=0.8),
    # seeds and overtraining of the winners
    _row("s", "dp", 0.014142, 8, 2.04, seed=1),
    _row("s", 8, 0.02, 8, 2.14, seed=1, outer_lr=0.8),
    _row("s", 8, 0.02, 8, 1.90, outer_lr=0.8, overtrain=4),
]


def test_winners_and_the_edges_they_sit_on():
  assert sp.inner_winner(ROWS, "s", "dp") == (0.014142, 8)
  # the 3 x 3 around it: rates 0.01 (0.014142 / sqrt 2), 0.014142, 0.02; batches 4, 8, 16;
  # tried: (0.02, 8), (0.014142, 16), (0.02, 16)
  assert sp.edge_neighbours(ROWS, "s", "dp") == [
      (0.01, 4),
      (0.014142, 4),
      (0.02, 4),
      (0.01, 8),
      (0.01, 16),
  ]
  assert sp.inner_winner(ROWS, "s", 8) == (0.02, 8)
  # batch 4 cannot split over 8 learners; at 16 the rates 0.014142 and 0.028284 are missing
  assert sp.edge_neighbours(ROWS, "s", 8) == [(0.014142, 16), (0.028284, 16)]
  assert sp.outer_cells(ROWS, "s", 8) == {0.6: 2.20, 0.8: 2.10, 1.0: 2.15}
  assert sp.outer_winner(ROWS, "s", 8) == 0.8 and sp.outer_winner(ROWS, "s", 2) is None
  assert sp.winning_point(ROWS, "s", 8, seed=2) == sp.point("s", 8, 0.02, 8, 2, 0.8)


def test_table_has_each_winning_cell_by_seed():
  table = sp.table(ROWS, ["s"])
  assert table == {("s", "dp"): [2.00, 2.04], ("s", 8): [2.10, 2.14]}
  assert sp.table(ROWS, ["s"], overtrain=4) == {("s", "dp"): [], ("s", 8): [1.90]}
  assert sp.mean([2.10, 2.14]) == pytest.approx(2.12) and sp.spread([2.10, 2.14]) == pytest.approx(
      0.02
  )
  assert sp.gap(2.12, 2.00) == pytest.approx(6.0)


def test_stage_files_build_their_points_from_the_rows(tmp_path):
  path = tmp_path
  lines = [json.dumps({**r, "status": "done", "name": f"run{i}"}) for i, r in enumerate(ROWS)]
  (tmp_path / "inner.jsonl").write_text("\n".join(lines))
  grid = scaling_inner.get_sweep("sizes=s")
  assert len(grid) == 5 * 9  # 3 rates x 3 batches (8, 16, 32: each splits over M <= 8) x 5 methods
  ext = scaling_inner.get_sweep(f"sizes=s,part=extend,results={path}")
  assert [(p["method"], p["lr"], p["batch"]) for p in ext][:2] == [
      ("dp", 0.01, 4),
      ("dp", 0.014142, 4),
  ]
  with pytest.raises(ValueError, match="no stage-.a. rows of size s, M=1"):
    scaling_outer.get_sweep(f"sizes=s,results={path}")
  with pytest.raises(ValueError, match="no stage-.a. rows of size s and method 1"):
    scaling_seeds.get_sweep(f"sizes=s,results={path}")  # every method's winner is needed
  tiny = [_row(s, m, 0.02, 16, 2.0 + i) for i, (s, m) in enumerate([("t1", "dp"), ("t1", 2)])]
  tiny += [_row("t2", m, lr, 8, 3.0 - lr) for m in ("dp", 2) for lr in (0.01, 0.02)]
  tiny += [_row("t2", 2, 0.02, 8, 2.5, outer_lr=0.4)]
  lines = [json.dumps({**r, "status": "done", "name": f"tiny{i}"}) for i, r in enumerate(tiny)]
  (tmp_path / "tiny.jsonl").write_text("\n".join(lines))
  seeds = scaling_seeds.get_sweep(f"tiny,sizes=t2,results={path}")
  assert [(p["size"], p["method"], p["lr"], p["batch"], p.get("outer_lr")) for p in seeds] == [
      ("t2", "dp", 0.02, 8, None),
      ("t2", "diloco", 0.02, 8, 0.4),  # 2.5 at outer lr 0.4 beats 2.98 at 0.6
  ]
  assert {p["seed"] for p in seeds} == {1}
  assert sp.winning_point(sp.read_rows(path), "t1", 2)["outer_lr"] == 0.6  # no stage (b) at t1
  # a larger size starts at the smaller one's winners: (0.02, 16) for both methods at t1
  moved = scaling_inner.get_sweep(f"tiny,sizes=t2,part=transfer,donor=t1,results={path}")
  assert [(p["size"], p["method"], p["lr"], p["batch"]) for p in moved] == [
      ("t2", "dp", 0.02, 16),
      ("t2", "diloco", 0.02, 16),
  ]
  with pytest.raises(ValueError, match="no stage-.a. rows of size s and method 1 to transfer"):
    scaling_inner.get_sweep(f"sizes=m,part=transfer,donor=s,results={path}")
  with pytest.raises(ValueError, match="donor=SIZE, one of"):
    scaling_inner.get_sweep(f"sizes=m,part=transfer,results={path}")
  over = scaling_overtrain.get_sweep(f"tiny,sizes=t2,results={path}")
  assert [p["overtrain"] for p in over] == [4] * 2 and over[1]["outer_lr"] == 0.4
  c = scaling_inner.get_config("sizes=s/m,part=extend,results=x,size=m,method=dp")
  assert c.steps == scaling_laws.steps("m", 16)


def test_loss_findings_read_the_papers_claims_off_a_table():
  # two sizes; at "a" M=1 is 0.01 above DP with seed half-ranges 0.02 and 0.005: it matches
  tab = {
      ("a", "dp"): [2.00, 2.01],
      ("a", 1): [2.00, 2.04],
      ("a", 2): [2.10],
      ("a", 4): [2.20],
      ("a", 8): [2.30],
      ("b", "dp"): [1.00],
      ("b", 1): [0.99],
      ("b", 2): [1.02],
      ("b", 4): [1.05],
      ("b", 8): [1.04],  # M=8 below M=4: (2) fails at b
  }
  one, two, three = sp.loss_findings(tab, ["a", "b"])
  assert one[1] == "shown" and "a: M=1 - DP = +0.0150 (seed half-range 0.0200)" in one[2]
  assert two[1] == "not shown"
  # gaps: a M=2 2.10/2.005 - 1 = +4.74%, b +2.00%; M=4 +9.73% -> +5.00%; M=8 +14.71% -> +4.00%
  assert three[1] == "shown" and "M=2: +4.74% -> +2.00%" in three[2]
  assert sp.loss_findings(tab, ["a"])[2][1] == "not decided"  # one size cannot show a trend


def test_tuning_findings_read_the_winners():
  rows = []
  for m, outer, batch in ((1, 0.4, 8), (2, 0.6, 16), (4, 0.6, 16), (8, 0.8, 32)):
    rows += [_row("a", m, 0.02, batch, 2.0), _row("a", m, 0.02, batch * 2, 2.1)]
    rows += [_row("a", m, 0.02, batch, 1.9, outer_lr=outer)] if outer != 0.6 else []
  rows += [_row("a", "dp", 0.02, 8, 2.0), _row("a", "dp", 0.02, 16, 2.1)]
  four, five = sp.tuning_findings(rows, ["a"])
  assert four == (
      "(4) the best outer lr grows with M and not with N",
      "shown",
      "a: M=1 0.4, M=2 0.6, M=4 0.6, M=8 0.8",
  )
  assert five[1] == "shown" and five[2] == "a: DP 8, M=1 8, M=2 16, M=4 16, M=8 32"


def test_overtraining_finding_compares_the_verdicts_decided_at_both_budgets():
  at_1x = [("(1) a", "shown", ""), ("(2) b", "not shown", ""), ("(3) c", "not decided", "")]
  same = [("(1) a", "shown", "x"), ("(2) b", "not shown", "y"), ("(3) c", "shown", "z")]
  assert sp.overtrain_finding(at_1x, same)[1] == "shown"  # (3) is not decided at 1x: not read
  flipped = [("(1) a", "not shown", "x")] + same[1:]
  assert sp.overtrain_finding(at_1x, flipped)[1] == "not shown"
  assert sp.overtrain_finding(at_1x[2:], same[2:])[1] == "not decided"
  assert (
      sp.overtrain_finding(at_1x, same)[2]
      == "(1) at 4x: shown (x); (2) at 4x: not shown (y); (3) at 4x: shown (z)"
  )


def test_decoupled_column_reuses_dilocos_inner_winner_and_tunes_its_outer_rate(tmp_path):
  c = scaling_laws.get_config("size=s,method=decoupled,learners=4,batch=8,lr=0.01,outer_lr=0.1")
  # The same budget and schedule as DiLoCo M=4's; the preset's rule and quorum, the paper's speeds
  assert (c.steps, c.batch_size, c.outer.learners, c.outer.inner_steps) == (1131, 2, 4, 30)
  assert (c.outer.delivery, c.outer.quorum, c.outer.fragments, c.outer.lr) == ("rebase", 1, 4, 0.1)
  assert (c.sim.speeds, c.sim.step_jitter) == ("1,1,1.18,1.18", 0.1)
  dec = [  # M = 8 at DiLoCo's winner (0.02, 8): 0.1 wins; a run off it does not count
      _row("s", "dec8", 0.02, 8, 2.30, outer_lr=0.1),
      _row("s", "dec8", 0.02, 8, 2.35, outer_lr=0.2),
      _row("s", "dec8", 0.02, 16, 1.00, outer_lr=0.2),
      _row("s", "dec8", 0.02, 8, 2.34, outer_lr=0.1, seed=1),
  ]
  rows = ROWS + dec + [_row("s", 2, 0.01, 4, 2.1), _row("s", 4, 0.01, 8, 2.15)]
  assert dec[0]["method"] == "decoupled" and sp.method_of(dec[0]) == "dec8"
  assert sp.decoupled_cells(rows, "s", "dec8") == {0.1: 2.30, 0.2: 2.35}
  assert sp.winning_point(rows, "s", "dec8") == sp.point("s", "dec8", 0.02, 8, 0, 0.1)
  assert sp.table(rows, ["s"])[("s", "dec8")] == [2.30, 2.34]
  lines = [json.dumps({**r, "status": "done", "name": f"run{i}"}) for i, r in enumerate(rows)]
  (tmp_path / "rows.jsonl").write_text("\n".join(lines))
  from configs.sweeps import scaling_decoupled as sd

  tune = sd.get_sweep(f"sizes=s,results={tmp_path}")
  assert [(p["learners"], p["lr"], p["batch"], p["outer_lr"]) for p in tune][::3] == [
      (2, 0.01, 4, 0.1),
      (4, 0.01, 8, 0.1),
      (8, 0.02, 8, 0.1),
  ]
  assert [p["outer_lr"] for p in tune][-3:] == [0.1, 0.2, 0.4]
  # M = 8's winner sits on the lowest rate tried: the next rung down; M = 2 and 4 have no rows
  extend = sd.get_sweep(f"sizes=s,part=extend,results={tmp_path}")
  assert [(p["method"], p["learners"], p["outer_lr"]) for p in extend] == [("decoupled", 8, 0.05)]
  with pytest.raises(ValueError, match=r"no finished seed-0 rows for \('size', 'learners'\)"):
    sd.get_sweep(f"sizes=s,part=seeds,results={tmp_path}")


def test_decoupled_finding_reads_the_gaps_to_dp_against_n():
  tab = {("s", "dp"): [2.0], ("m", "dp"): [1.5], ("s", "dec2"): [2.2], ("m", "dec2"): [1.56]}
  claim, verdict, nums = sp.decoupled_finding(tab, ["s", "m"])
  assert verdict == "shown" and nums == "M=2: s +10.00% -> m +4.00%"
  tab[("m", "dec2")] = [1.8]  # +20%: the gap grew
  assert sp.decoupled_finding(tab, ["s", "m"])[1] == "not shown"
  assert sp.decoupled_finding(tab, ["s"])[1] == "not decided"
