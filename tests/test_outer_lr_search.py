"""Each row at its own outer lr: the search over a sweep's rows, and the regime ablations' parts and
table (on rows made up by hand)."""

import json
import os

import pytest

from configs.sweeps import ablations_regime as ar
from diloco.sweeps import sweep
from experiments.studies import ablation_table as at, outer_lr_search as search

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _row(cell, lr, loss, seed=0):
  learners, merge, codec, frag = cell
  return dict(
      name=f"{cell}+{lr}+{seed}",
      status="done",
      learners=learners,
      merge=merge,
      codec=codec,
      frag=frag,
      outer_lr=lr,
      seed=seed,
      eval_loss=loss,
  )


def test_winners_edges_and_missing_cells():
  keys = ("k",)
  rows = [dict(k="a", outer_lr=lr, seed=0, eval_loss=l) for lr, l in ((0.2, 2.0), (0.4, 1.9))]
  rows += [dict(k="a", outer_lr=0.8, seed=1, eval_loss=0.1)]  # seed 1 never picks the winner
  rows += [dict(k="b", outer_lr=lr, seed=0, eval_loss=l) for lr, l in ((0.2, 1.5), (0.4, 1.6))]
  rows += [dict(k="c", outer_lr=lr, seed=0, eval_loss=l) for lr, l in ((0.2, 1.6), (0.4, 1.5))]
  rows += [dict(k="c", outer_lr=0.8, seed=0, eval_loss=1.7)]
  assert search.winners(rows, keys) == {("a",): 0.4, ("b",): 0.2, ("c",): 0.4}
  # a: 0.4 is the highest seed-0 rate tried (0.8 ran only at seed 1, so it counts as tried);
  # b: 0.2 is the lowest: 0.1 next; c: interior
  assert search.past_edges(rows, keys, [("a",), ("b",), ("c",)]) == [("b", 0.1)]
  with pytest.raises(ValueError, match=r"no finished seed-0 rows for \('k',\) \[\('d',\)\]"):
    search.need_winners(rows, keys, [("a",), ("d",)], "DIR")


def test_one_stage_of_a_sweep_files_search_by_hand():
  # Cells a and b over the ladder (0.2, 0.4). a won at 0.4 (its highest: 0.8 next), b at 0.2
  # (interior: 0.1 and 0.4 were tried). Seeds 1 and 2 at the winners; a file's own part gets the winners.
  point = lambda c, lr, seed: dict(k=c[0], outer_lr=lr, seed=seed)
  rows = [dict(k="a", outer_lr=lr, seed=0, eval_loss=l) for lr, l in ((0.2, 2.0), (0.4, 1.9))]
  rows += [
      dict(k="b", outer_lr=lr, seed=0, eval_loss=l)
      for lr, l in ((0.1, 1.7), (0.2, 1.5), (0.4, 1.6))
  ]
  stage = lambda part, results="DIR", **kw: search.stage_points(
      part, results, keys=("k",), cells=[("a",), ("b",)], grid=(0.2, 0.4), point=point,
      rows=lambda: rows, seeds=(1, 2), **kw,
  )  # fmt: skip
  assert [(p["k"], p["outer_lr"]) for p in stage("tune", "")] == [
      ("a", 0.2),
      ("a", 0.4),
      ("b", 0.2),
      ("b", 0.4),
  ]
  assert [p["outer_lr"] for p in stage("tune", "", rate_major=True)] == [0.2, 0.2, 0.4, 0.4]
  assert stage("extend") == [dict(k="a", outer_lr=0.8, seed=0)]
  assert stage("seeds", seed_cells=[("b",)]) == [
      dict(k="b", outer_lr=0.2, seed=1),
      dict(k="b", outer_lr=0.2, seed=2),
  ]
  assert stage("best", more={"best": lambda rows, best: [best]}) == [{("a",): 0.4, ("b",): 0.2}]
  with pytest.raises(ValueError, match="part=seeds needs results=DIR"):
    stage("seeds", "")
  with pytest.raises(ValueError, match="unknown part 'time'; known: tune, extend, seeds"):
    stage("time")
  rows[:] = rows[:2]  # b not tuned yet: every stage waits for it, unless extend_tuned
  for part in ("extend", "seeds"):
    with pytest.raises(ValueError, match=r"no finished seed-0 rows for \('k',\) \[\('b',\)\]"):
      stage(part)
  assert stage("extend", extend_tuned=True) == [dict(k="a", outer_lr=0.8, seed=0)]


def test_rows_at_winners_and_differences_that_count():
  keys = ("k",)
  rows = [dict(k="a", outer_lr=0.4, seed=s, eval_loss=l) for s, l in ((1, 1.95), (0, 1.9))]
  rows += [dict(k="a", outer_lr=0.2, seed=s, eval_loss=l) for s, l in ((0, 2.0), (1, 1.0))]
  lr, at = search.at_winners(rows, keys)[("a",)]
  assert lr == 0.4 and [r["eval_loss"] for r in at] == [1.9, 1.95]  # seed order, winner's rate
  won = search.tuned(rows, keys)[("a",)]
  assert (won.outer_lr, won.losses) == (0.4, (1.9, 1.95))
  assert won.loss == pytest.approx(1.925) and won.spread == pytest.approx(0.025)
  assert search.half_range([1.9, 1.95, 1.92]) == pytest.approx(0.025)
  assert search.half_range([1.9]) == 0.0
  # 1.90 against 2.00: better by 0.10, which counts past a spread of 0.05 and not past 0.12
  assert search.compare(1.90, 2.00, 0.05) == 1 and search.compare(2.00, 1.90, 0.05) == -1
  assert search.compare(1.90, 2.00, 0.12) == 0
  assert search.compare(0.91, 0.90, 0.005, lower_is_better=False) == 1  # accuracies


def test_regime_ablation_parts(tmp_path):
  tune = ar.get_sweep("part=tune")
  assert len(tune) == 2 * 7 and {p["outer_lr"] for p in tune} == {0.2, 0.4}
  loss = {0.2: 2.0, 0.4: 2.1}
  rows = [_row(c, lr, loss[lr]) for c in ar.TUNED for lr in ar.OUTER_LRS]
  rows[-1] = _row(ar.TUNED[-1], 0.4, 1.0)  # 1-bit's winner at the higher rate
  (tmp_path / "tune.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  res = f"results={tmp_path}"
  extend = ar.get_sweep(f"part=extend,{res}")  # a winner on either edge goes one rung further
  assert [(p["codec"], p["outer_lr"]) for p in extend if p["codec"] == "1bit"] == [("1bit", 0.8)]
  assert len(extend) == 7 and {p["outer_lr"] for p in extend[:-1]} == {0.1}
  frags = ar.get_sweep(f"part=fragments,{res}")
  assert [(p["frag"], p["outer_lr"]) for p in frags] == [("layer", 0.2), ("fine", 0.2)]
  seeds = ar.get_sweep(f"part=seeds,{res}")
  assert len(seeds) == 9 and {p["seed"] for p in seeds} == {1}
  assert [p["outer_lr"] for p in seeds if p["codec"] == "1bit"] == [0.4]
  # the regime: 16 sequences of 64 bytes per learner step whatever M, 2,000 steps, H = 20
  c = ar.get_config("learners=16,merge=mean,outer_lr=0.8,part=seeds,results=x")
  assert (c.batch_size, c.seq_len, c.steps, c.outer.inner_steps) == (16, 64, 2000, 20)
  assert (c.outer.learners, c.outer.merge, c.outer.lr, c.optimizer.lr) == (16, "mean", 0.8, 1e-2)
  assert (c.outer.fragments, c.outer.fragment_kind) == (4, "balanced")
  assert ar.get_config("frag=fine").outer.fragments == 8


def test_every_tiny_point_builds():
  spec = os.path.join(REPO, "configs", "sweeps", "ablations_regime.py") + ":tiny,part=tune"
  points = sweep.points(spec, sweep.load_module(sweep.split_spec(spec)[0]))
  assert [p.values["outer_lr"] for p in points] == [0.4] * 5  # the five M = 8 cells, one rate


def test_async_regime_parts_start_from_the_pretrained_run(tmp_path):
  from configs.sweeps import async_regime as asr

  assert asr.get_sweep("part=pretrain") == [dict(stage="pretrain")]
  pre = asr.get_config("stage=pretrain")
  assert (pre.mode, pre.batch_size, pre.steps, pre.optimizer.lr) == ("dp", 64, 1000, 2e-2)
  with pytest.raises(ValueError, match="where part=pretrain finished"):
    asr.get_sweep(f"part=tune,results={tmp_path}")
  for where in ("a", "b"):
    (tmp_path / where / asr.PRETRAIN).mkdir(parents=True)
    (tmp_path / where / asr.PRETRAIN / "summary.json").write_text("{}")
  spec = os.path.join(REPO, "configs", "sweeps", "async_regime.py")
  names = {}
  for where in ("a", "b"):
    pts = sweep.points(f"{spec}:part=tune,results={tmp_path / where}", sweep.load_module(spec))
    names[where] = [p.name for p in pts]
    assert pts[0].overrides["init_from"] == str(tmp_path / where / asr.PRETRAIN)
  # 5 methods x 4 levels x 3 rates; the names do not depend on where the sweep ran
  assert names["a"] == names["b"] and len(names["a"]) == 60
  assert names["a"][0] == "method=sync+hetero=none+outer_lr=0.1+seed=0"
  rows = [dict(stage="pretrain", name="p", status="done")]
  for m, lv in asr._cells(False):
    for lr, loss in ((0.1, 2.1), (0.2, 2.0), (0.4, 2.05 if m != "async" else 1.9)):
      rows.append(
          dict(
              name=f"{m}{lv}{lr}",
              status="done",
              method=m,
              hetero=lv,
              outer_lr=lr,
              seed=0,
              eval_loss=loss,
          )
      )
  (tmp_path / "a" / "tune.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  ext = asr.get_sweep(f"part=extend,results={tmp_path / 'a'}")
  assert {(p["method"], p["outer_lr"]) for p in ext} == {("async", 0.8)}  # 0.4 won: the high edge
  seeds = asr.get_sweep(f"part=seeds,results={tmp_path / 'a'}")
  assert len(seeds) == 3 * 4 * 2 and {p["method"] for p in seeds} == {"sync", "async", "dn_dylu"}
  c = asr.get_config("method=dn_dylu,hetero=very,outer_lr=0.2")
  assert (c.outer.learners, c.batch_size, c.steps, c.outer.inner_steps) == (4, 16, 2000, 20)
  assert (c.outer.optimizer, c.outer.lr, c.sim.speeds) == ("delayed_nesterov", 0.2, "1,1.3,2.6,5.7")


def _cell(cell, lr, *losses):
  return [_row(cell, lr, loss, seed) for seed, loss in enumerate(losses)]


def _table_rows():
  M, P, F = at.REGIME_MERGE, at.REGIME_PRECISION, at.REGIME_FRAGMENTATION
  rows = _cell(at.REGIME_BASE, 0.4, 2.00, 2.02)  # RDA, M=8, fp4, balanced: 2.01 ± 0.01
  rows += _cell(M[("mean", 8)], 0.2, 2.10, 2.10)  # RDA 0.09/2.10 = 4.29% better, past 0.48%
  rows += _cell(M[("rda", 16)], 0.8, 1.90, 1.92)
  rows += _cell(M[("mean", 16)], 0.4, 1.95, 1.95)  # RDA 0.04/1.95 = 2.05% better, past 0.51%
  rows += _cell(P["fp32"], 0.4, 2.005, 2.015)  # fp4 2.01 against 2.01: +0.00%
  rows += _cell(P["2bit"], 0.2, 2.20, 2.20)  # +9.45%
  rows += _cell(P["1bit"], 0.2, 2.50, 2.60)  # 2.55: +26.87%
  rows += _cell(F["by layer, P=2"], 0.4, 2.012, 2.016)  # +0.20%, within the spread 0.50%
  rows += _cell(F["balanced, P=8"], 0.4, 2.03, 2.03)  # +1.00%, past it
  rows += [_row(at.REGIME_BASE, 0.2, 2.5), _row(at.REGIME_BASE, 0.8, 2.3)]  # lost the tuning
  return rows


def test_cells_take_each_winner_and_its_seeds():
  table = at.regime_cells(_table_rows() + [dict(_row(at.REGIME_BASE, 0.1, 1.0), status="failed")])
  base = table[at.REGIME_BASE]
  assert (base.outer_lr, base.losses) == (0.4, (2.00, 2.02))
  assert table[at.REGIME_PRECISION["1bit"]].spread == pytest.approx(0.05)
  with pytest.raises(ValueError, match="different evaluation sets"):
    at.regime_cells(_table_rows() + [dict(_row(at.REGIME_BASE, 0.1, 2.0), eval_set="x")])


def test_findings_count_differences_past_the_seed_spread():
  got = at.regime_findings(at.regime_cells(_table_rows()))
  verdicts = [(claim.split(" ")[0], v) for claim, v, _ in got]
  assert verdicts == [("RDA", "shown"), ("4-bit", "shown"), ("fragmentation", "not shown")]
  assert "M=8: RDA -4.29% (±0.48%)" in got[0][2] and "M=16: RDA -2.05% (±0.51%)" in got[0][2]
  assert "fp4 +0.00% (±0.50%), 2bit +9.45% (±0.25%), 1bit +26.87% (±2.49%)" in got[1][2]
  assert "by layer, P=2 +0.20% (±0.50%), balanced, P=8 +1.00% (±0.50%)" in got[2][2]


def test_findings_wait_for_their_cells():
  rows = [r for r in _table_rows() if r["codec"] != "2bit" and r["learners"] != 16]
  rows = [r for r in rows if r["frag"] != "fine"]
  got = at.regime_findings(at.regime_cells(rows))
  # no 2-bit: no precision finding; M = 8 only; by layer only (+0.20%, within the spread)
  assert [(c, v) for c, v, _ in got] == [
      ("RDA beats the plain average at M=8", "shown"),
      ("fragmentation barely matters (within 0.2% of balanced, or of the seed spread)", "shown"),
  ]


def test_grid_text_has_a_column_per_rate_and_stars_each_winner():
  grid = {("b",): {0.2: 1.5, 0.4: 1.25}, ("a",): {0.1: 2.0, 0.2: 1.75}, ("c",): {}}
  text = search.grid_text(grid, lambda c: f"cell {c[0]}")
  # widths: the longest label "cell a" (6) + 2; each rate right-aligned in 9; a loss in 8 + mark.
  assert text.split("\n") == [
      " " * 8 + "      0.1      0.2      0.4",
      "  cell a  2.0000   1.7500*",  # sorted cells; "c" tried nothing: no line
      "  cell b           1.5000   1.2500*",
  ]
  first = search.grid_text(grid, lambda c: c[0], cells=[("b",), ("a",)]).split("\n")[1]
  assert first == "  b           1.5000   1.2500*"  # the order asked for


def test_the_staged_search_runs_each_stage_in_order_and_stops_extending_when_none_is_left():
  calls = []

  def stage(arg: str, table: str) -> bool:
    calls.append((arg, table))
    return table != "rda_extend2"  # the second extension has no point left

  search.run_stages(
      stage, "R", 3, tune=[("part=rda,x=1", "rda")], prefix="rda_", extra="delivery=rebase"
  )
  assert calls == [
      ("part=rda,x=1", "rda"),
      ("part=rda_extend,delivery=rebase,results=R", "rda_extend1"),
      ("part=rda_extend,delivery=rebase,results=R", "rda_extend2"),
      ("part=rda_seeds,delivery=rebase,seeds=3,results=R", "rda_seeds"),
  ]
  calls.clear()
  search.run_stages(stage, "R", 2, between=("fragments",), after=("time",), extends=1)
  assert calls == [
      ("part=tune", "tune"),
      ("part=extend,results=R", "extend1"),
      ("part=fragments,results=R", "fragments"),
      ("part=seeds,seeds=2,results=R", "seeds"),
      ("part=time,seeds=2,results=R", "time"),
  ]
