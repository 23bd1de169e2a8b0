"""The Async Local-SGD table with each (method, level) at its own outer lr, on rows made up by hand."""

import math

import pytest

from experiments.studies import async_table as at


def _row(method, level, lr, loss, seed=0, merges=100):
  return dict(
      name=f"{method}+{level}+{lr}+{seed}",
      status="done",
      method=method,
      hetero=level,
      outer_lr=lr,
      seed=seed,
      eval_loss=loss,
      merges=merges,
      eval_set="e",
  )


def test_tuned_cells_pick_each_winner_and_its_seeds():
  rows = [dict(name="stage=pretrain", status="done", stage="pretrain", eval_loss=9.0, eval_set="e")]
  rows += [_row("async", "none", lr, l) for lr, l in ((0.1, 1.90), (0.2, 1.95), (0.4, 5.0))]
  rows += [_row("async", "none", 0.1, 1.94, seed=1), _row("async", "none", 0.2, 1.0, seed=1)]
  rows += [_row("sync", "none", 0.4, 1.80, merges=7)]
  rows += [dict(_row("sync", "none", 0.2, 1.0), status="failed")]  # never a winner
  assert at.tuning(rows)[("async", "none")] == {0.1: 1.90, 0.2: 1.95, 0.4: 5.0}
  table = at.tuned(rows)
  cell = table[("async", "none")]
  # seed 0 chose 0.1; its seeds are 1.90 and 1.94 (seed 1 at 0.2 is not in the cell)
  assert (cell.outer_lr, cell.losses, cell.rows[0]["merges"]) == (0.1, (1.90, 1.94), 100)
  assert cell.loss == pytest.approx(1.92) and cell.spread == pytest.approx(0.02)
  sync = table[("sync", "none")]
  assert (sync.outer_lr, sync.losses, sync.rows[0]["merges"]) == (0.4, (1.80,), 7)
  with pytest.raises(ValueError, match="different evaluation sets"):
    at.tuned(rows + [dict(_row("dn", "none", 0.1, 1.8), eval_set="other")])


def test_tuned_findings_count_only_differences_past_the_spread():
  rows = []
  # none: sync 1.80/1.82 (±0.01), async 1.90/1.90 (worse by 0.09), dn_dylu 1.805/1.815 (within)
  # very: sync 1.80/1.80, async 1.81/1.83 (worse by 0.02, spread 0.01), dn_dylu 1.70 (better)
  for seed, (s, a, d) in enumerate([(1.80, 1.90, 1.805), (1.82, 1.90, 1.815)]):
    rows += [_row("sync", "none", 0.4, s, seed), _row("async", "none", 0.1, a, seed)]
    rows += [_row("dn_dylu", "none", 0.2, d, seed)]
  for seed, (s, a, d) in enumerate([(1.80, 1.81, 1.70), (1.80, 1.83, 1.70)]):
    rows += [_row("sync", "very", 0.4, s, seed), _row("async", "very", 0.1, a, seed)]
    rows += [_row("dn_dylu", "very", 0.2, d, seed)]
  got = at.tuned_findings(at.tuned(rows))
  assert [v for _, v, _ in got] == ["shown", "shown"]
  # exp(0.09) - 1 = +9.42%; exp(0.02) - 1 = +2.02%
  assert "none +9.42% (±0.0100 nats), very +2.02% (±0.0100 nats)" in got[0][2]
  assert f"very {at.pct(math.exp(-0.1) - 1)}" in got[1][2]
  # dn_dylu 1.85 at very: worse than sync's 1.80 past the spread (0), so: the second finding is not shown
  rows = [r for r in rows if not (r["method"] == "dn_dylu" and r["hetero"] == "very")]
  rows += [_row("dn_dylu", "very", 0.2, 1.85), _row("dn_dylu", "very", 0.2, 1.85, 1)]
  assert [v for _, v, _ in at.tuned_findings(at.tuned(rows))] == ["shown", "not shown"]
