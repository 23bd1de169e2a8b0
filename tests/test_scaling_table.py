"""The scaling-laws table from sweep rows: tuned outer lr, cells over seeds, gaps and findings."""

import math

import pytest

from experiments.studies import scaling_table as st


def _dp(size, seed, loss):
  return {"status": "done", "size": size, "method": "dp", "seed": seed, "eval_loss": loss}


def _dl(size, m, lr, seed, loss):
  return {
      "status": "done",
      "size": size,
      "method": "diloco",
      "learners": m,
      "outer_lr": lr,
      "seed": seed,
      "eval_loss": loss,
  }


ROWS = [
    _dp("a", 0, 2.0),
    _dp("a", 1, 2.2),  # DP at a: mean 2.1
    _dl("a", 1, 0.4, 0, 2.05),
    _dl("a", 1, 0.8, 0, 1.95),  # M=1 winner 0.8
    _dl("a", 2, 0.4, 0, 2.30),
    _dl("a", 2, 0.8, 0, 2.40),  # M=2 winner 0.4
    _dl("a", 1, 0.8, 1, 2.15),  # M=1 at a: mean (1.95 + 2.15) / 2 = 2.05
    _dp("b", 0, 1.0),
    _dl("b", 1, 0.8, 0, 1.01),
    _dl("b", 2, 0.4, 0, 1.05),
    _dl("b", 2, 0.8, 0, 0.5),  # not the tuned lr for M=2: left out of the table
    {**_dp("a", 0, 9.0), "batch": 4},  # a table2 point: left out of the table
    {**_dp("b", 1, 0.1), "status": "failed"},
]


def test_winners_and_grid_at_the_tuning_size():
  assert st.winners(ROWS, "a") == {1: (0.8, 1.95), 2: (0.4, 2.30)}
  assert st.grid(ROWS, "a") == {1: {0.4: 2.05, 0.8: 1.95}, 2: {0.4: 2.30, 0.8: 2.40}}


def test_cells_keep_the_tuned_lr_and_every_seed():
  table = st.cells(ROWS, {1: 0.8, 2: 0.4})
  assert table == {
      ("a", "dp"): [2.0, 2.2],
      ("a", 1): [1.95, 2.15],
      ("a", 2): [2.30],
      ("b", "dp"): [1.0],
      ("b", 1): [1.01],
      ("b", 2): [1.05],
  }
  assert st.seed_spread(table) == pytest.approx({("a", "dp"): 0.2, ("a", 1): 0.2})


def test_findings_with_the_numbers():
  table = st.cells(ROWS, {1: 0.8, 2: 0.4})
  (m1, holds1, text1), (_, holds2, text2), (_, holds3, text3) = st.findings(table, ["a", "b"])
  # M=1 against DP: a 2.05/2.1 - 1 = -2.38%; b 1.01/1.0 - 1 = +1.00%: not at every size.
  assert "M=1" in m1 and not holds1 and text1 == "a: -2.38%, b: +1.00%"
  # loss grows with M: a 2.05 < 2.30, b 1.01 < 1.05.
  assert holds2 and text2 == "a: 2.0500 < 2.3000; b: 1.0100 < 1.0500"
  # M=2 gap: a 2.30/2.1 - 1 = +9.52%, b +5.00%: it shrinks with N.
  assert holds3 and text3 == "M=2: +9.52% -> +5.00%"


def test_the_paper_tables_as_published():
  gaps = {n: st.gap(r[8], r["dp"]) for n, r in st.PAPER_TABLE4.items()}
  assert gaps[35e6] == pytest.approx(3.621 / 3.485 - 1)
  assert gaps[35e6] > gaps[90e6] > gaps[180e6] > 0  # finding 3 holds in the paper's numbers
  assert all(r[1] <= r["dp"] for r in st.PAPER_TABLE4.values())  # finding 1 too
  assert list(st.PAPER_TABLE2.values()) == [16.23, 15.30, 14.72, 15.02]
  assert math.isnan(st.mean([]))
