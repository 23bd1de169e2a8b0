"""The DiLoCo scaling-laws table from a sweep's rows: cells, tuned outer learning rates, findings.

Rows are those of experiments.sweep over configs/sweeps/scaling.py (results.jsonl): a `size`, a
`method` (dp or diloco), `learners` and `outer_lr` for DiLoCo, a `seed`, and the run's `eval_loss`
and `params`. A cell is (size, 'dp') or (size, M); its losses are one per seed.
"""

import collections
import math
from collections.abc import Iterable, Sequence
from typing import Any

from diloco.sweeps import eval_sets

# Charles et al. 2025 (arXiv 2503.09799), Table 4: evaluation loss at D = 20N tokens, outer lr tuned.
PAPER_TABLE4 = {
    35e6: {"dp": 3.485, 1: 3.482, 2: 3.508, 4: 3.554, 8: 3.621},
    90e6: {"dp": 3.167, 1: 3.162, 2: 3.182, 4: 3.213, 8: 3.265},
    180e6: {"dp": 2.950, 1: 2.943, 2: 2.957, 4: 2.981, 8: 3.019},
}
# Douillard et al. 2023 (arXiv 2311.08105), Table 2: perplexity, 8 replicas, H = 500.
PAPER_TABLE2 = {
    "one learner, batch B": 16.23,
    "data-parallel, batch 8B": 15.30,
    "one learner, 8x steps": 14.72,
    "DiLoCo M=8, batch B each": 15.02,
}
METHODS = ("dp", 1, 2, 4, 8)

Cell = tuple[str, Any]  # (size, 'dp' | M)


def _plain(row: dict[str, Any]) -> bool:
  """A row of the table's budget (not a table2 point with its own batch or steps)."""
  return row.get("status") == "done" and not row.get("batch")


def winners(
    rows: Iterable[dict[str, Any]], size: str, seed: int = 0
) -> dict[int, tuple[float, float]]:
  """M -> (outer lr with the lowest eval loss at `size`, that loss), over the swept grid."""
  best: dict[int, tuple[float, float]] = {}
  for r in eval_sets.same(rows, "scaling table"):
    if _plain(r) and r["method"] == "diloco" and r["size"] == size and r["seed"] == seed:
      m, lr, loss = int(r["learners"]), float(r["outer_lr"]), float(r["eval_loss"])
      if m not in best or loss < best[m][1]:
        best[m] = (lr, loss)
  return dict(sorted(best.items()))


def grid(rows: Iterable[dict[str, Any]], size: str, seed: int = 0) -> dict[int, dict[float, float]]:
  """M -> {outer lr: eval loss} at `size`."""
  out: dict[int, dict[float, float]] = collections.defaultdict(dict)
  for r in eval_sets.same(rows, "scaling table"):
    if _plain(r) and r["method"] == "diloco" and r["size"] == size and r["seed"] == seed:
      out[int(r["learners"])][float(r["outer_lr"])] = float(r["eval_loss"])
  return {m: dict(sorted(v.items())) for m, v in sorted(out.items())}


def cells(rows: Sequence[dict[str, Any]], lrs: dict[int, float]) -> dict[Cell, list[float]]:
  """(size, 'dp' | M) -> eval losses over seeds; DiLoCo cells at the outer lr `lrs[M]`."""
  out: dict[Cell, list[float]] = collections.defaultdict(list)
  for r in sorted(eval_sets.same(rows, "scaling table"), key=lambda r: r["seed"]):
    if not _plain(r):
      continue
    if r["method"] == "dp":
      out[(r["size"], "dp")].append(float(r["eval_loss"]))
    elif math.isclose(float(r["outer_lr"]), lrs.get(int(r["learners"]), math.nan)):
      out[(r["size"], int(r["learners"]))].append(float(r["eval_loss"]))
  return dict(out)


def mean(xs: Sequence[float]) -> float:
  return sum(xs) / len(xs) if xs else math.nan


def gap(loss: float, dp: float) -> float:
  """Relative gap to data-parallel: loss / dp - 1 (positive = worse than dp)."""
  return loss / dp - 1.0


def findings(table: dict[Cell, list[float]], sizes: Sequence[str]) -> list[tuple[str, bool, str]]:
  """The paper's three findings on our table: (claim, does our table show it, the numbers)."""
  mu = {k: mean(v) for k, v in table.items()}
  ms = sorted({m for _, m in mu if m != "dp"})
  out = []
  m1 = [(s, gap(mu[(s, 1)], mu[(s, "dp")])) for s in sizes if (s, 1) in mu and (s, "dp") in mu]
  out.append(
      (
          "M=1 DiLoCo matches or beats data-parallel at every size",
          bool(m1) and all(g <= 0 for _, g in m1),
          ", ".join(f"{s}: {100 * g:+.2f}%" for s, g in m1),
      )
  )
  mono = []
  for s in sizes:
    losses = [mu.get((s, m), math.nan) for m in ms]
    mono.append((s, all(a < b for a, b in zip(losses, losses[1:])), losses))
  out.append(
      (
          "the loss grows with M",
          all(ok for _, ok, _ in mono),
          "; ".join(f"{s}: " + " < ".join(f"{x:.4f}" for x in ls) for s, _, ls in mono),
      )
  )
  shrink, text = True, []
  for m in [m for m in ms if m >= 2]:
    gaps = [gap(mu[(s, m)], mu[(s, "dp")]) for s in sizes if (s, m) in mu and (s, "dp") in mu]
    shrink &= len(gaps) == len(sizes) and all(a > b for a, b in zip(gaps, gaps[1:]))
    text.append(f"M={m}: " + " -> ".join(f"{100 * g:+.2f}%" for g in gaps))
  out.append(
      ("the relative gap of M>=2 to data-parallel shrinks as N grows", shrink, "; ".join(text))
  )
  return out


def seed_spread(table: dict[Cell, list[float]]) -> dict[Cell, float]:
  """Max - min over seeds, for the cells with two or more."""
  return {k: max(v) - min(v) for k, v in table.items() if len(v) > 1}
