"""The heterogeneous-hardware table (configs/sweeps/heterogeneous.py): each (domain, policy) at its
own best outer learning rate, its seeds' eval loss, accuracy and goodput, and the paper's three
findings decided on them.

A difference between two cells counts when it exceeds the larger of their seed half-ranges (half
the max - min over seeds); within that, they match.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from experiments.studies import outer_lr_search as search

Row = dict[str, Any]
POLICIES = ("wait_all", "k1", "k1_grace")  # the table's rows
DOMAINS = ("text", "vision")  # and columns
KEYS = ("domain", "policy")  # a cell of the table
# The paper's rows (Decoupled DiLoCo 2026, from secondary descriptions): goodput %, text average,
# vision average (higher is better for both).
PAPER = {
    "wait_all": (84, 54.4, 37.6),
    "k1": (100, 51.4, 25.7),
    "k1_grace": (100, 55.3, 37.0),
}


@dataclasses.dataclass(frozen=True)
class Cell:
  """One (domain, policy) at its winning outer lr, over its seeds."""

  outer_lr: float
  losses: tuple[float, ...]
  accuracies: tuple[float, ...]  # empty for text
  goodputs: tuple[float, ...]

  @property
  def loss(self) -> float:
    return _mean(self.losses)

  @property
  def accuracy(self) -> float:
    return _mean(self.accuracies)

  @property
  def goodput(self) -> float:
    return _mean(self.goodputs)

  @property
  def loss_spread(self) -> float:
    return search.half_range(self.losses)

  @property
  def accuracy_spread(self) -> float:
    return search.half_range(self.accuracies)


def _mean(xs: Sequence[float]) -> float:
  return sum(xs) / len(xs) if xs else math.nan


def tuning(rows: Sequence[Row]) -> dict[tuple[str, str], dict[float, float]]:
  """(domain, policy) -> {outer lr: seed-0 eval loss}."""
  return search.tuning(rows, KEYS)


def cells(rows: Sequence[Row]) -> dict[tuple[str, str], Cell]:
  """Every (domain, policy) with a seed-0 row, at its winning outer lr (lowest seed-0 loss)."""
  out = {}
  for key, (lr, at) in search.at_winners(rows, KEYS).items():
    accuracy = tuple(r["eval_accuracy"] for r in at if r.get("eval_accuracy") not in (None, ""))
    out[key] = Cell(
        lr,
        tuple(r["eval_loss"] for r in at),
        accuracy,
        tuple(r["goodput"] for r in at),
    )
  return out


def quality(cell: Cell, domain: str) -> tuple[float, float, bool]:
  """The number the paper reports for a domain: (value, seed half-range, lower is better)."""
  if domain == "vision":
    return cell.accuracy, cell.accuracy_spread, False
  return cell.loss, cell.loss_spread, True


def findings(table: dict[tuple[str, str], Cell]) -> list[tuple[str, str, str]]:
  """(claim, verdict, numbers) for the paper's three findings, per domain present."""
  out = []
  goodput = {p: _mean([c.goodput for (d, q), c in table.items() if q == p]) for p in POLICIES}
  shown = goodput["wait_all"] < goodput["k1"] - 0.01 and goodput["k1_grace"] >= goodput["wait_all"]
  out.append(
      (
          "waiting for all learners costs goodput; K=1 (with or without grace) does not wait",
          "shown" if shown else "not shown",
          ", ".join(f"{p} {100 * goodput[p]:.1f}%" for p in POLICIES) + " (paper: 84%, 100%, 100%)",
      )
  )
  for domain in DOMAINS:
    if not all((domain, p) in table for p in POLICIES):
      continue
    q = {p: quality(table[(domain, p)], domain) for p in POLICIES}
    unit = "accuracy" if domain == "vision" else "eval loss"
    paper = {p: PAPER[p][2 if domain == "vision" else 1] for p in POLICIES}

    def say(p: str) -> str:
      v, s, _ = q[p]
      text = f"{100 * v:.2f}% (±{100 * s:.2f})" if domain == "vision" else f"{v:.4f} (±{s:.4f})"
      return f"{p} {text}"

    lower = q["k1"][2]
    k1_vs_all = search.compare(
        q["k1"][0], q["wait_all"][0], max(q["k1"][1], q["wait_all"][1]), lower
    )
    out.append(
        (
            f"{domain}: K=1 without the grace window is worse than waiting for all ({unit})",
            "shown" if k1_vs_all < 0 else "not shown",
            f"{say('k1')} vs {say('wait_all')}; paper {paper['k1']} vs {paper['wait_all']}",
        )
    )
    g_vs_all = search.compare(
        q["k1_grace"][0], q["wait_all"][0], max(q["k1_grace"][1], q["wait_all"][1]), lower
    )
    g_vs_k1 = search.compare(q["k1_grace"][0], q["k1"][0], max(q["k1_grace"][1], q["k1"][1]), lower)
    out.append(
        (
            f"{domain}: the grace window recovers it: K=1 with grace matches or beats waiting for all,"
            f" and beats K=1 without ({unit})",
            "shown" if g_vs_all >= 0 and g_vs_k1 > 0 else "not shown",
            f"{say('k1_grace')} vs {say('wait_all')} and {say('k1')}; paper {paper['k1_grace']} vs"
            f" {paper['wait_all']} and {paper['k1']}",
        )
    )
  return out
