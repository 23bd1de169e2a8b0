"""The scaling-laws study under the paper's protocol (configs/scaling_laws.py), from its sweep rows.

Rows are those of experiments.sweep over the four stage files (configs/sweeps/scaling_inner.py,
scaling_outer.py, scaling_seeds.py, scaling_overtrain.py): a `size`, a `method` (dp or diloco),
`learners` and `outer_lr` for DiLoCo, the peak inner `lr`, the global `batch`, a `seed`, an
`overtrain` factor (absent: 1) and the run's `eval_loss`. A method is 'dp' or M (DiLoCo's learners).

Winners, as the paper picks them: stage (a) the (inner lr, batch) of the lowest final eval loss per
(size, method) at outer lr STAGE_A_OUTER_LR; stage (b) the outer lr of the lowest loss per (size, M)
at the stage-(a) winner; a winning cell's losses are then one per seed.
"""

import glob
import json
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

METHODS = ("dp", 1, 2, 4, 8)
STAGE_A_OUTER_LR = 0.6
OUTER_LRS = (0.2, 0.4, 0.6, 0.8, 1.0)

Method = str | int  # 'dp' or M


def read_rows(workdir: str) -> list[dict[str, Any]]:
  """The finished rows of every sweep table (*.jsonl) in `workdir`, each run once (by name)."""
  rows: dict[str, dict[str, Any]] = {}
  for path in sorted(glob.glob(os.path.join(workdir, "*.jsonl"))):
    with open(path, encoding="utf-8") as f:
      for r in (json.loads(line) for line in f if line.strip()):
        if r.get("status") == "done":
          rows[r["name"]] = r
  return list(rows.values())


def method_of(row: dict[str, Any]) -> Method:
  return "dp" if row["method"] == "dp" else int(row["learners"])


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
  out = {"size": size, "method": "dp" if method == "dp" else "diloco", "lr": lr, "batch": batch}
  out["seed"] = seed
  if method != "dp":
    out.update(learners=method, outer_lr=outer_lr)
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
  """The stage-(a) cells past the edges its winner sits on: the next rate of the sqrt(2) ladder
  at the winning batch, the next power-of-2 batch at the winning rate (never below M)."""
  best = inner_winner(rows, size, method)
  if best is None:
    return []
  got = inner_cells(rows, size, method)
  lr, batch = best
  lrs = sorted(l for l, b in got if b == batch)
  batches = sorted(b for l, b in got if l == lr)
  m = 1 if method == "dp" else method
  out = []
  if lr == lrs[0]:
    out.append((round(lr / math.sqrt(2), 6), batch))
  if lr == lrs[-1]:
    out.append((round(lr * math.sqrt(2), 6), batch))
  if batch == batches[0] and batch // 2 >= m:
    out.append((lr, batch // 2))
  if batch == batches[-1]:
    out.append((lr, batch * 2))
  return [c for c in out if c not in got]


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


def winning_point(rows, size: str, method: Method, seed: int = 0, overtrain: int = 1, tiny=False):
  """The sweep point of (size, method)'s winning cell (stage (a), then (b) for DiLoCo)."""
  best = inner_winner(rows, size, method)
  if best is None:
    raise ValueError(f"no stage-(a) rows of size {size} and method {method}")
  outer = None if method == "dp" else outer_winner(rows, size, method)  # None: stage (b) not run
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
  return out
