"""The regime ablation table, each cell at its own outer lr, on rows made up by hand."""

import pytest

from diloco.studies import ablation_table as at


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
      eval_set="e",
  )


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
