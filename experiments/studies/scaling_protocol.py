"""The scaling-laws study under the paper's protocol (configs/scaling_laws.py), from its sweep rows.

Rows are those of experiments.sweep over the four stage files (configs/sweeps/scaling_inner.py,
scaling_outer.py, scaling_seeds.py, scaling_overtrain.py): a `size`, a `method` (dp or diloco),
`learners` and `outer_lr` for DiLoCo, the peak inner `lr`, the global `batch`, a `seed`, an
`overtrain` factor (absent: 1) and the run's `eval_loss`. A method is 'dp', M (DiLoCo's learners)
or 'decM' (Decoupled DiLoCo of M learners, configs/sweeps/scaling_decoupled.py).

Winners, as the paper picks them: stage (a) the (inner lr, batch) of the lowest final eval loss per
(size, method) at outer lr STAGE_A_OUTER_LR; stage (b) the outer lr of the lowest loss per (size, M)
at the stage-(a) winner; a winning cell's losses are then one per seed.
"""

import glob
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

from diloco import jsonl

METHODS = ("dp", 1, 2, 4, 8)
TINY_METHODS = ("dp", 2)  # what the tiny modes of the stage files compare
STAGE_A_OUTER_LR = 0.6
OUTER_LRS = (0.2, 0.4, 0.6, 0.8, 1.0)

DECOUPLED = ("dec2", "dec4", "dec8")  # Decoupled DiLoCo's column: M = 2, 4, 8
TINY_DECOUPLED = ("dec2",)
DECOUPLED_OUTER_LRS = (0.1, 0.2, 0.4)  # a doubling ladder (rebase's best in the main job: 0.1)

Method = str | int  # 'dp', M or 'decM'
LADDER_BASE = 2e-2  # the inner learning rates tried are 2e-2 x sqrt(2)^k


def rung(k: int) -> float:
  """Rate k of the inner learning-rate ladder, 2e-2 x sqrt(2)^k, to 6 decimals."""
  return round(LADDER_BASE * math.sqrt(2) ** k, 6)


def read_rows(workdir: str) -> list[dict[str, Any]]:
  """The finished rows of every sweep table (*.jsonl) in `workdir`, each run once (by name)."""
  rows: dict[str, dict[str, Any]] = {}
  for path in sorted(glob.glob(os.path.join(workdir, "*.jsonl"))):
    for r in jsonl.read(path):
      if r.get("status") == "done":
        rows[r["name"]] = r
  return list(rows.values())


def method_of(row: dict[str, Any]) -> Method:
  if row["method"] == "decoupled":
    return f"dec{int(row['learners'])}"
  return "dp" if row["method"] == "dp" else int(row["learners"])


def learners_of(method: Method) -> int:
  """M of a method (data-parallel: 1)."""
  if method == "dp":
    return 1
  return int(method[3:]) if isinstance(method, str) else method


def point(
    size: str,
    method: Method,
    lr: float,
    batch: int,
    seed: int = 0,
    outer_lr: float = STAGE_A_OUTER_LR,
    overtrain: int = 1,
    tiny: bool = False,
) -> dict[str, Any]:
  """A sweep point (its keys always in this order, so one run has one name in every stage)."""
  name = "dp" if method == "dp" else ("decoupled" if isinstance(method, str) else "diloco")
  out = {"size": size, "method": name, "lr": lr, "batch": batch}
  out["seed"] = seed
  if method != "dp":
    out.update(learners=learners_of(method), outer_lr=outer_lr)
  if overtrain != 1:
    out["overtrain"] = overtrain
  return {**out, "tiny": True} if tiny else out


def _rows(rows, size, method, seed=0, overtrain=1) -> list[dict[str, Any]]:
  return [
      r
      for r in rows
      if r.get("size") == size
      and method_of(r) == method
      and r.get("seed", 0) == seed
      and r.get("overtrain", 1) == overtrain
  ]


def inner_cells(rows, size: str, method: Method) -> dict[tuple[float, int], float]:
  """Stage (a): (lr, batch) -> final eval loss of (size, method), seed 0."""
  return {
      (float(r["lr"]), int(r["batch"])): r["eval_loss"]
      for r in _rows(rows, size, method)
      if method == "dp" or float(r["outer_lr"]) == STAGE_A_OUTER_LR
  }


def inner_winner(rows, size: str, method: Method) -> tuple[float, int] | None:
  got = inner_cells(rows, size, method)
  return min(got, key=got.get) if got else None


def edge_neighbours(rows, size: str, method: Method) -> list[tuple[float, int]]:
  """The cells around the stage-(a) winner not tried yet: its 3 x 3 neighbourhood of the sqrt(2)
  rate ladder and the power-of-2 batches (never below M sequences). Empty: the winner beats every
  neighbour, diagonals included (the best rate moves with the batch, so a search along one axis
  at a time would stop short)."""
  best = inner_winner(rows, size, method)
  if best is None:
    return []
  got = inner_cells(rows, size, method)
  lr, batch = best
  m = 1 if method == "dp" else method
  k = round(math.log(lr / LADDER_BASE, math.sqrt(2)))  # the nearest rung to the winner's rate
  rates = (rung(k - 1), lr, rung(k + 1))
  batches = [b for b in (batch // 2, batch, batch * 2) if b >= m]  # (m >= 1: never 0)
  near = [(r, b) for b in batches for r in rates if (r, b) != best]
  return [c for c in near if c not in got]


def outer_cells(rows, size: str, m: int) -> dict[float, float]:
  """Stage (b): outer lr -> final eval loss of DiLoCo M at its stage-(a) winner, seed 0."""
  best = inner_winner(rows, size, m)
  return {
      float(r["outer_lr"]): r["eval_loss"]
      for r in _rows(rows, size, m)
      if best is not None and (float(r["lr"]), int(r["batch"])) == best
  }


def outer_winner(rows, size: str, m: int) -> float | None:
  got = outer_cells(rows, size, m)
  return min(got, key=got.get) if got else None


def decoupled_cells(rows, size: str, method: str) -> dict[float, float]:
  """Decoupled DiLoCo 'decM': outer lr -> final eval loss at DiLoCo M's stage-(a) winner (its
  inner lr and batch, reused), seed 0."""
  best = inner_winner(rows, size, learners_of(method))
  return {
      float(r["outer_lr"]): r["eval_loss"]
      for r in _rows(rows, size, method)
      if best is not None and (float(r["lr"]), int(r["batch"])) == best
  }


def winning_point(rows, size: str, method: Method, seed: int = 0, overtrain: int = 1, tiny=False):
  """The sweep point of (size, method)'s winning cell (stage (a), then (b) for DiLoCo; Decoupled
  DiLoCo: DiLoCo's stage-(a) winner at the same M, and its own outer rate)."""
  inner = learners_of(method) if isinstance(method, str) and method != "dp" else method
  best = inner_winner(rows, size, inner)
  if best is None:
    raise ValueError(f"no stage-(a) rows of size {size} and method {inner}")
  if isinstance(method, str) and method != "dp":
    got = decoupled_cells(rows, size, method)
    outer = min(got, key=got.get) if got else None
  else:  # None: stage (b) not run
    outer = None if method == "dp" else outer_winner(rows, size, method)
  outer = STAGE_A_OUTER_LR if outer is None else outer
  return point(size, method, *best, seed=seed, outer_lr=outer, overtrain=overtrain, tiny=tiny)


def cell_losses(rows, size: str, method: Method, overtrain: int = 1) -> list[float]:
  """The final eval losses, one per seed, of (size, method)'s winning cell."""
  want = winning_point(rows, size, method)
  keys = [k for k in want if k not in ("seed", "tiny")]
  out = {}
  for r in rows:
    if r.get("overtrain", 1) == overtrain and all(_same(r.get(k), want[k]) for k in keys):
      out[r.get("seed", 0)] = r["eval_loss"]
  return [out[s] for s in sorted(out)]


def _same(a, b) -> bool:
  return a is not None and (float(a) == float(b) if isinstance(b, float) else a == b)


def mean(xs: Sequence[float]) -> float:
  return sum(xs) / len(xs) if xs else math.nan


def spread(xs: Sequence[float]) -> float:
  """Half the range of a cell's seeds (0 with one seed)."""
  return (max(xs) - min(xs)) / 2 if xs else math.nan


def gap(loss: float, dp: float) -> float:
  """Relative gap to data-parallel, in percent."""
  return 100.0 * (loss / dp - 1.0)


def table(rows, sizes: Iterable[str], overtrain: int = 1) -> dict[tuple[str, Method], list[float]]:
  """(size, method) -> the winning cell's losses by seed, for every method with rows."""
  out = {}
  for s in sizes:
    for method in METHODS:
      if inner_winner(rows, s, method) is not None:
        out[(s, method)] = cell_losses(rows, s, method, overtrain)
    for method in DECOUPLED:
      if decoupled_cells(rows, s, method):
        out[(s, method)] = cell_losses(rows, s, method, overtrain)
  return out


PAPER_TABLE4 = {  # Charles et al. 2025 (arXiv 2503.09799), Table 4: eval loss at D = 20N (C4)
    35e6: {"dp": 3.485, 1: 3.482, 2: 3.508, 4: 3.554, 8: 3.621},
    90e6: {"dp": 3.167, 1: 3.162, 2: 3.182, 4: 3.213, 8: 3.265},
    180e6: {"dp": 2.950, 1: 2.943, 2: 2.957, 4: 2.981, 8: 3.019},
}

Finding = tuple[str, str, str]  # (claim, 'shown' | 'not shown' | 'not decided', the numbers)


def _verdict(ok: bool | None) -> str:
  return "not decided" if ok is None else ("shown" if ok else "not shown")


def loss_findings(
    tab: dict[tuple[str, Method], list[float]], sizes: Sequence[str]
) -> list[Finding]:
  """Findings (1)-(3) on a table of winning cells (losses by seed); a size missing a cell is
  left out of the finding that needs it."""
  mu = {k: mean(v) for k, v in tab.items() if v}
  half = {k: spread(v) for k, v in tab.items() if v}
  have = [s for s in sizes if all((s, m) in mu for m in METHODS)]
  out = []
  # (1) M = 1 matches (within the larger seed half-range of the two cells) or beats DP
  rows = [(s, mu[(s, 1)] - mu[(s, "dp")], max(half[(s, 1)], half[(s, "dp")])) for s in have]
  ok = all(d <= tol for _, d, tol in rows) if rows else None
  nums = "; ".join(f"{s}: M=1 - DP = {d:+.4f} (seed half-range {tol:.4f})" for s, d, tol in rows)
  out.append(("(1) M=1 matches or beats data-parallel at every size", _verdict(ok), nums))
  # (2) loss grows with M
  ok = all(mu[(s, 1)] < mu[(s, 2)] < mu[(s, 4)] < mu[(s, 8)] for s in have) if have else None
  nums = "; ".join(f"{s}: " + " < ".join(f"{mu[(s, m)]:.4f}" for m in METHODS[1:]) for s in have)
  out.append(("(2) the loss grows with M (M = 1, 2, 4, 8)", _verdict(ok), nums))
  # (3) the relative gap of M >= 2 shrinks as N grows
  gaps = {(s, m): gap(mu[(s, m)], mu[(s, "dp")]) for s in have for m in (2, 4, 8)}
  ok = None
  if len(have) >= 2:
    ok = all(gaps[(a, m)] > gaps[(b, m)] for m in (2, 4, 8) for a, b in zip(have, have[1:]))
  nums = "; ".join(
      f"M={m}: " + " -> ".join(f"{gaps[(s, m)]:+.2f}%" for s in have) for m in (2, 4, 8)
  )
  out.append(("(3) the relative gap of M >= 2 to DP shrinks as N grows", _verdict(ok), nums))
  return out


def tuning_findings(rows, sizes: Sequence[str]) -> list[Finding]:
  """Findings (4) and (5): the best outer lr against M and N, the best global batch against M."""
  outer = {(s, m): outer_winner(rows, s, m) for s in sizes for m in METHODS[1:]}
  tuned = [s for s in sizes if all(outer[(s, m)] is not None for m in METHODS[1:])]
  grows = lambda xs: all(a <= b for a, b in zip(xs, xs[1:])) and xs[-1] > xs[0]
  ok_m = all(grows([outer[(s, m)] for m in METHODS[1:]]) for s in tuned) if tuned else None
  ok_n = None
  if len(tuned) >= 2:  # within one step of the grid (0.2) from size to size
    ok_n = all(
        abs(outer[(a, m)] - outer[(b, m)]) <= 0.2 + 1e-9
        for m in METHODS[1:]
        for a, b in zip(tuned, tuned[1:])
    )
  ok = None if ok_m is None else (ok_m and ok_n is not False)
  nums = "; ".join(
      f"{s}: " + ", ".join(f"M={m} {outer[(s, m)]:g}" for m in METHODS[1:]) for s in tuned
  )
  out = [("(4) the best outer lr grows with M and not with N", _verdict(ok), nums)]
  batch = {(s, m): (inner_winner(rows, s, m) or (None, None))[1] for s in sizes for m in METHODS}
  have = [s for s in sizes if all(batch[(s, m)] is not None for m in METHODS)]
  ok = None
  if have:
    ok = all(
        all(batch[(s, m)] > batch[(s, "dp")] for m in (2, 4, 8))
        and all(batch[(s, a)] <= batch[(s, b)] for a, b in zip(METHODS[1:], METHODS[2:]))
        for s in have
    )
  nums = "; ".join(
      f"{s}: " + ", ".join(f"{'DP' if m == 'dp' else f'M={m}'} {batch[(s, m)]}" for m in METHODS)
      for s in have
  )
  out.append(("(5) DiLoCo's best global batch exceeds DP's and grows with M", _verdict(ok), nums))
  return out


def overtrain_finding(at_1x: list[Finding], at_4x: list[Finding]) -> Finding:
  """Finding (6): (1)-(3) get the same verdicts on the 4x-overtrained table (those decided at both)."""
  pairs = [(a[1], b[1]) for a, b in zip(at_1x, at_4x) if "not decided" not in (a[1], b[1])]
  ok = all(x == y for x, y in pairs) if pairs else None
  nums = "; ".join(f"{claim[:3]} at 4x: {v} ({n})" for claim, v, n in at_4x)
  return ("(6) findings (1)-(3) read the same overtrained 4x", _verdict(ok), nums)


def decoupled_finding(tab: dict[tuple[str, Method], list[float]], sizes: Sequence[str]) -> Finding:
  """The paper's "Decoupled DiLoCo performs better with scale relative to data-parallel": for each M, its
  relative gap to DP falls from size to size (the sizes with DP's cell and Decoupled's)."""
  mu = {k: mean(v) for k, v in tab.items() if v}
  per_m = {}
  for method in DECOUPLED:
    have = [s for s in sizes if (s, "dp") in mu and (s, method) in mu]
    if len(have) >= 2:
      per_m[method] = [(s, gap(mu[(s, method)], mu[(s, "dp")])) for s in have]
  ok = None
  if per_m:
    ok = all(a[1] > b[1] for g in per_m.values() for a, b in zip(g, g[1:]))
  nums = "; ".join(
      f"M={learners_of(m)}: " + " -> ".join(f"{s} {x:+.2f}%" for s, x in g)
      for m, g in per_m.items()
  )
  claim = "Decoupled DiLoCo's relative gap to DP shrinks as N grows (M = 2, 4, 8)"
  return (claim, _verdict(ok), nums)
