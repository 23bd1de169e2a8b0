"""The merge clock's tables (configs/sweeps/merge_clock.py): each (clock, scale) pair at its own
best outer learning rate in every study cell, with the verdicts the issue asks for.

A cell's winner is its rate of lowest seed-0 eval loss (outer_lr_search); its row is the mean
and half-range over the seeds run at that rate. Two cells differ when their means differ by
more than the larger half-range; otherwise they are "within the spread".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from experiments.studies import outer_lr_search as search, scavenging_table as scavenging

Row = dict[str, Any]
PAIRS = (("arrival", "one"), ("period", "one"), ("arrival", "tokens"), ("period", "tokens"))


def label(pair: tuple[str, str]) -> str:
  return f"{pair[0]}/{pair[1]}"


def stats(rows: Sequence[Row], key: str = "eval_loss") -> tuple[float, float, int]:
  """(mean, half-range, seeds) of `key` over rows."""
  xs = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
  if not xs:
    return math.nan, math.nan, 0
  return sum(xs) / len(xs), search.half_range(xs), len(xs)


def winners(rows: Sequence[Row], keys: Sequence[str]) -> dict[tuple, tuple[float, list[Row]]]:
  """cell -> (its winning outer lr, its rows at that lr, every seed)."""
  return search.at_winners(rows, keys)


def rungs(rates: Sequence[float]) -> float:
  """How far apart the winners sit on the doubling ladder: log2(max / min)."""
  return math.log2(max(rates) / min(rates)) if rates else math.nan


def invariance(rows: Sequence[Row], counts: Sequence[int]) -> list[dict[str, Any]]:
  """Study a: per pair, each M's winning rate and loss, and the ladder rungs between the
  winners (0: the winner stayed put)."""
  best = winners(rows, ("learners", "clock", "scale"))
  out = []
  for pair in PAIRS:
    per = {m: best[(m, *pair)] for m in counts if (m, *pair) in best}
    if not per:
      continue
    out.append(
        dict(
            pair=label(pair),
            per_m={m: (lr, *stats(at)) for m, (lr, at) in per.items()},
            rungs=rungs([lr for lr, _ in per.values()]),
        )
    )
  return out


def one_rate(rows: Sequence[Row], counts: Sequence[int]) -> dict[str, tuple[float, float, int]]:
  """Study a, as a user who sets one rate whatever M is: per pair, among the rates run at every M
  of `counts` (seed 0), the one whose worst excess over each M's own best loss is least:
  {pair: (that rate, its worst excess, the M where it is worst)}. A pair run at fewer M is left
  out."""
  out = {}
  for pair in PAIRS:
    loss: dict[int, dict[float, float]] = {}
    for r in rows:
      if (r["clock"], r["scale"]) == pair and int(r.get("seed", 0)) == 0:
        loss.setdefault(int(r["learners"]), {})[float(r["outer_lr"])] = float(r["eval_loss"])
    if any(m not in loss for m in counts):
      continue
    common = set.intersection(*(set(loss[m]) for m in counts))
    if not common:
      continue
    best = {m: min(loss[m].values()) for m in counts}
    worst = {lr: max((loss[m][lr] - best[m], m) for m in counts) for lr in common}
    lr = min(common, key=lambda x: (worst[x][0], x))
    out[label(pair)] = (lr, *worst[lr])
  return out


def invariance_text(table: list[dict[str, Any]], counts: Sequence[int]) -> str:
  head = f"{'clock/scale':<16}" + "".join(f"{'M = ' + str(m):>26}" for m in counts)
  lines = [head + f"{'winner moves (rungs)':>22}"]
  for row in table:
    cells = []
    for m in counts:
      if m in row["per_m"]:
        lr, mu, hr, n = row["per_m"][m]
        cells.append(f"{lr:g}: {mu:.4f} ±{hr:.4f} ({n})".rjust(26))
      else:
        cells.append(f"{'not run':>26}")
    lines.append(f"{row['pair']:<16}" + "".join(cells) + f"{row['rungs']:>22g}")
  return "\n".join(lines)


def compare(a: tuple[float, float, int], b: tuple[float, float, int]) -> str:
  """'lower', 'higher' or 'within the spread': a's mean against b's."""
  if a[2] == 0 or b[2] == 0:
    return "not run"
  spread = max(a[1], b[1])
  if abs(a[0] - b[0]) <= spread:
    return "within the spread"
  return "lower" if a[0] < b[0] else "higher"


def _against(a: tuple[float, float, int], b: tuple[float, float, int]) -> str:
  said = compare(a, b)
  return said + (" of" if said == "within the spread" else " than")


def grace_verdicts(rows: Sequence[Row]) -> list[tuple[str, str]]:
  """Study c: per pair, the grace window's claim (K = 1 alone loses quality against waiting
  for all; K = 1 with grace recovers it): (pair, verdict)."""
  best = winners(rows, ("policy", "clock", "scale"))
  wait = best.get(("wait_all", "arrival", "one"))
  wait_s = stats(wait[1]) if wait else (math.nan, math.nan, 0)
  out = []
  for pair in PAIRS:
    k1, grace = best.get(("k1", *pair)), best.get(("k1_grace", *pair))
    if not (k1 and grace):
      out.append((label(pair), "not run"))
      continue
    s1, sg = stats(k1[1]), stats(grace[1])
    loses = compare(s1, wait_s) == "higher"
    recovers = compare(sg, s1) == "lower" and compare(sg, wait_s) != "higher"
    shown = "SHOWN" if loses and recovers else "NOT SHOWN"
    out.append(
        (
            label(pair),
            f"{shown}: K = 1 {s1[0]:.4f} ±{s1[1]:.4f} ({_against(s1, wait_s)} waiting for "
            f"all, {wait_s[0]:.4f} ±{wait_s[1]:.4f}); with grace {sg[0]:.4f} ±{sg[1]:.4f} "
            f"({_against(sg, s1)} K = 1 alone)",
        )
    )
  return out


def gap(decoupled: tuple[float, float, int], diloco: tuple[float, float, int]) -> float:
  """Decoupled's mean over synchronous DiLoCo's, less one (a share: 0.0277 is 2.77%)."""
  return decoupled[0] / diloco[0] - 1.0


def tuned_scavenging(rows: Sequence[Row]) -> dict[tuple[str, str], dict[str, Any]]:
  """Study b at each row's own rate: per pair, each row's (extra learners) winning outer rate
  on its seed-0 ladder with its rows there, and the times to the 4-learner run's final loss
  with that run at its own winning rate (`scavenging_table.relative_times`, seed by seed, the
  seeds both have)."""
  out = {}
  for pair in PAIRS:
    mine = [r for r in rows if (r["clock"], r["scale"]) == pair]
    best = winners(mine, ("extra",))
    if not best:
      continue
    at = [r for _, (_, rs) in sorted(best.items()) for r in rs]
    out[pair] = {
        "rates": {int(k[0]): lr for k, (lr, _) in best.items()},
        "losses": {int(k[0]): stats(rs) for k, (_, rs) in best.items()},
        "times": scavenging.relative_times(at),
    }
  return out
