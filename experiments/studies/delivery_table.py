"""The delivery-rule table (configs/sweeps/delivery.py): each (setting, domain, policy, delivery)
at its own best outer learning rate, at equal tokens and at equal time, with quality, goodput,
merged share and learners per merge, and the findings decided on it.

Cells are keyed by the sweep's KEYS; the functions take the axes they read (policies, deliveries)
so that this module needs nothing of the config files. A difference between two cells counts when
it exceeds the larger of their seed half-ranges (half the max - min over seeds).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from experiments.studies import outer_lr_search as search

Row = dict[str, Any]
Key = tuple[str, str, str, str]  # (setting, domain, policy, delivery)
KEYS = ("setting", "domain", "policy", "delivery")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One (setting, domain, policy, delivery) at one outer lr, over its seeds."""

  outer_lr: float
  rows: tuple[Row, ...]

  def values(self, key: str) -> tuple[float, ...]:
    return tuple(float(r[key]) for r in self.rows if r.get(key) not in (None, ""))

  def mean(self, key: str) -> float:
    xs = self.values(key)
    return sum(xs) / len(xs) if xs else math.nan

  def spread(self, key: str) -> float:
    xs = self.values(key)
    return search.half_range(xs) if xs else math.nan

  @property
  def seeds(self) -> int:
    return len(self.rows)


def budget_of(row: Row) -> str:
  return row.get("budget") or "tokens"


def cells(rows: Sequence[Row], budget: str = "tokens") -> dict[Key, Cell]:
  """Every cell with a seed-0 row at equal tokens, at its winning outer lr (lowest seed-0 loss
  at equal tokens); under budget=time, the time rows at that same lr."""
  tokens = [r for r in rows if budget_of(r) == "tokens"]
  winners = search.at_winners(tokens, KEYS)
  if budget == "tokens":
    return {k: Cell(lr, tuple(at)) for k, (lr, at) in winners.items()}
  out = {}
  for k, (lr, _) in winners.items():
    at = [
        r
        for r in rows
        if budget_of(r) == budget
        and search.cell_of(r, KEYS) == k
        and math.isclose(float(r["outer_lr"]), lr)
    ]
    if at:
      out[k] = Cell(lr, tuple(sorted(at, key=lambda r: int(r["seed"]))))
  return out


def quality(cell: Cell, domain: str) -> tuple[float, float, bool]:
  """(value, seed half-range, lower is better): eval loss for text, accuracy for vision."""
  key = "eval_accuracy" if domain == "vision" else "eval_loss"
  return cell.mean(key), cell.spread(key), domain != "vision"


def _say(cell: Cell, domain: str) -> str:
  v, s, _ = quality(cell, domain)
  n = f"{cell.seeds} seed{'s' * (cell.seeds != 1)}"
  if domain == "vision":
    return f"{100 * v:.2f}% (±{100 * s:.2f}, {n})"
  return f"{v:.4f} (±{s:.4f}, {n})"


def _compare(a: Cell, b: Cell, domain: str) -> int:
  """+1 when a is better than b past both cells' seed half-ranges, -1 worse, 0 within."""
  (va, sa, lower), (vb, sb, _) = quality(a, domain), quality(b, domain)
  return search.compare(va, vb, max(sa, sb), lower)


def findings(
    table: dict[Key, Cell], policies: Sequence[str], deliveries: Sequence[str], budget: str
) -> list[tuple[str, str, str]]:
  """(claim, verdict, numbers): per (setting, domain, delivery), the paper's grace-window claim
  (K=1 with grace at least as good as waiting for all, K=1 alone worse); per (setting, domain,
  policy), whether each keeping rule merges more of the work than replace and how it scores."""
  out = []
  places = sorted({k[:2] for k in table})
  for setting, domain in places:
    for d in deliveries:
      got = {p: table.get((setting, domain, p, d)) for p in ("wait_all", "k1", "k1_grace")}
      if any(c is None for c in got.values()):
        continue
      grace_ok = _compare(got["k1_grace"], got["wait_all"], domain) >= 0
      k1_worse = _compare(got["k1"], got["wait_all"], domain) < 0
      out.append(
          (
              f"{setting}, {domain}, {d}, equal {budget}: K=1 with grace at least as good as"
              " waiting for all, K=1 alone worse",
              "shown" if grace_ok and k1_worse else "not shown",
              ", ".join(f"{p} {_say(c, domain)}" for p, c in got.items()),
          )
      )
    for p in policies:
      base = table.get((setting, domain, p, "replace"))
      if base is None:
        continue
      for d in deliveries:
        c = table.get((setting, domain, p, d))
        if d == "replace" or c is None:
          continue
        verdict = {1: "better", 0: "within the seed spread", -1: "worse"}[_compare(c, base, domain)]
        out.append(
            (
                f"{setting}, {domain}, {p}, equal {budget}: {d} against replace",
                verdict,
                f"{_say(c, domain)} vs {_say(base, domain)}; merged share"
                f" {c.mean('merged_share'):.2f} vs {base.mean('merged_share'):.2f}",
            )
        )
  return out


# Point 4: radial-directional averaging against the mean, cells (learners, policy, merge).
RDA_KEYS = ("learners", "policy", "merge")
RDA_POLICIES = ("wait_all", "k1_grace")


def rda_rows(rows: Sequence[Row], delivery: str) -> list[Row]:
  """Point 4's rows at equal tokens under `delivery`: its own (they have `merge`) and point 3's
  text rows at the paper setting of its policies, which are its (M = 8, rda) cells (the same
  runs)."""
  out = []
  for r in rows:
    if budget_of(r) != "tokens" or r.get("delivery") != delivery:
      continue
    if r.get("merge"):
      out.append(r)
    elif (r.get("setting"), r.get("domain")) == ("paper", "text") and r["policy"] in RDA_POLICIES:
      out.append(dict(r, learners=8, merge="rda"))
  return out


def rda_cells(rows: Sequence[Row]) -> dict[tuple, Cell]:
  """Each (learners, policy, merge) at its winning outer lr (lowest seed-0 eval loss)."""
  return {k: Cell(lr, tuple(at)) for k, (lr, at) in search.at_winners(rows, RDA_KEYS).items()}


def rda_findings(table: dict[tuple, Cell]) -> list[tuple[str, str, str]]:
  """(claim, verdict, numbers) per (learners, policy): RDA against the plain mean."""
  out = []
  for m, policy in sorted({k[:2] for k in table}):
    rda, mean = table.get((m, policy, "rda")), table.get((m, policy, "mean"))
    if rda is None or mean is None:
      continue
    verdict = {1: "better", 0: "within the seed spread", -1: "worse"}[_compare(rda, mean, "text")]
    out.append(
        (
            f"M = {m}, {policy}: RDA against the mean",
            verdict,
            f"{_say(rda, 'text')} at lr {rda.outer_lr:g} vs {_say(mean, 'text')} at lr"
            f" {mean.outer_lr:g}; learners per merge {rda.mean('mean_quorum'):.2f}",
        )
    )
  return out
