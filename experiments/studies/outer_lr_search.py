"""Each cell of a study at its own best outer learning rate: the winners among a sweep's finished
rows, the next rung past a winner on the edge of what was tried, and the seeds to run at winners.

A cell is a tuple of a row's values under `keys` (e.g. ("domain", "policy")); rows are a sweep
table's (diloco/sweeps/sweep_run.py), with `outer_lr`, `seed` and `eval_loss` columns. The ladder
doubles: a winner at the lowest rate tried gets half of it next, at the highest twice.
`run_stages` runs a table's search stage by stage (tune, extend until no cell is on an edge,
seeds), the one staging every notebook uses; `stage_points` lists one stage's points, the one
staging every sweep file's `get_sweep` uses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]
Cell = tuple[Any, ...]


def cell_of(row: Row, keys: Sequence[str]) -> Cell:
  return tuple(row[k] for k in keys)


def winners(rows: Sequence[Row], keys: Sequence[str]) -> dict[Cell, float]:
  """cell -> the outer lr of its lowest seed-0 eval loss."""
  best: dict[Cell, tuple[float, float]] = {}
  for r in rows:
    if int(r.get("seed", 0)) != 0:
      continue
    cell, lr = cell_of(r, keys), float(r["outer_lr"])
    if cell not in best or r["eval_loss"] < best[cell][1]:
      best[cell] = (lr, r["eval_loss"])
  return {c: v[0] for c, v in best.items()}


def tuning(rows: Sequence[Row], keys: Sequence[str]) -> dict[Cell, dict[float, float]]:
  """cell -> {outer lr: seed-0 eval loss}: the grid each winner was picked from."""
  out: dict[Cell, dict[float, float]] = {}
  for r in rows:
    if int(r.get("seed", 0)) == 0:
      out.setdefault(cell_of(r, keys), {})[float(r["outer_lr"])] = float(r["eval_loss"])
  return out


def grid_text(
    grid: dict[Cell, dict[float, float]], label, cells: Sequence[Cell] | None = None
) -> str:
  """The tuning grid as text: one line per cell (`label(cell)`; `cells`' order, else sorted), one
  column per outer lr tried anywhere, each cell's winner starred."""
  cells = [c for c in (sorted(grid) if cells is None else cells) if grid.get(c)]
  lrs = sorted({lr for c in cells for lr in grid[c]})
  names = [label(c) for c in cells]
  width = max(map(len, names), default=0) + 2
  lines = [" " * width + "".join(f"{lr:>9g}" for lr in lrs)]
  for cell, name in zip(cells, names):
    losses, best = grid[cell], min(grid[cell], key=grid[cell].get)
    line = "".join(
        f"{losses[lr]:>8.4f}{'*' if lr == best else ' '}" if lr in losses else " " * 9 for lr in lrs
    )
    lines.append(f"{name:>{width}}{line}".rstrip())
  return "\n".join(lines)


def tried(rows: Sequence[Row], keys: Sequence[str], cell: Cell) -> set[float]:
  return {float(r["outer_lr"]) for r in rows if cell_of(r, keys) == cell}


def need_winners(rows: Sequence[Row], keys: Sequence[str], cells: Sequence[Cell], where: str):
  """`winners` of `cells`; ValueError naming the cells without a finished seed-0 row."""
  best = winners(rows, keys)
  missing = [c for c in cells if c not in best]
  if missing:
    raise ValueError(f"no finished seed-0 rows for {tuple(keys)} {missing} in {where}")
  return best


def past_edges(rows: Sequence[Row], keys: Sequence[str], cells: Sequence[Cell]) -> list[Cell]:
  """(cell..., outer lr) one rung past every winner that sits on the edge of its tried rates."""
  best = winners(rows, keys)
  out = []
  for cell in cells:
    if cell not in best:
      continue
    lr, got = best[cell], tried(rows, keys, cell)
    for nxt in (lr / 2, lr * 2):
      if nxt not in got and (nxt < min(got) or nxt > max(got)):
        out.append((*cell, nxt))
  return out


def at_winners(rows: Sequence[Row], keys: Sequence[str]) -> dict[Cell, tuple[float, list[Row]]]:
  """cell -> (its winning outer lr, its finished rows at that lr in seed order)."""
  out = {}
  for cell, lr in winners(rows, keys).items():
    at = [r for r in rows if cell_of(r, keys) == cell and float(r["outer_lr"]) == lr]
    out[cell] = (lr, sorted(at, key=lambda r: int(r.get("seed", 0))))
  return out


@dataclasses.dataclass(frozen=True)
class Winner:
  """One cell at its winning outer lr: its finished rows there, in seed order."""

  outer_lr: float
  rows: tuple[Row, ...]

  @property
  def losses(self) -> tuple[float, ...]:
    return tuple(float(r["eval_loss"]) for r in self.rows)

  @property
  def loss(self) -> float:
    return sum(self.losses) / len(self.losses) if self.rows else math.nan

  @property
  def spread(self) -> float:
    return half_range(self.losses)


def tuned(rows: Sequence[Row], keys: Sequence[str]) -> dict[Cell, Winner]:
  """cell -> its `Winner` (every cell with a seed-0 row)."""
  return {c: Winner(lr, tuple(at)) for c, (lr, at) in at_winners(rows, keys).items()}


def half_range(xs: Sequence[float]) -> float:
  """Half of max - min over seeds: the spread a difference must exceed to count."""
  return (max(xs) - min(xs)) / 2 if len(xs) > 1 else 0.0


def compare(a: float, b: float, spread: float, lower_is_better: bool = True) -> int:
  """+1 if a is better than b by more than `spread`, -1 if worse, 0 if they match."""
  d = (b - a) if lower_is_better else (a - b)
  return 0 if abs(d) <= spread else (1 if d > 0 else -1)


def run_stages(
    stage: Callable[[str, str], bool],
    results: str,
    seeds: int,
    *,
    tune: Sequence[tuple[str, str]] = (("part=tune", "tune"),),
    between: Sequence[str] = (),
    after: Sequence[str] = (),
    prefix: str = "",
    extra: str = "",
    extends: int = 5,
) -> None:
  """A table's staged search, each stage run or loaded by `stage(arg, table)`
  (`sweep_run.stager`): the `tune` stages ((arg, table) pairs), part=extend one rung past any
  winner on its grid's edge until a stage has no point (at most `extends`), the parts
  `between`, then part=seeds with `seeds` seeds and the parts `after` with them. `prefix` names
  a second search's parts (`rda_`: rda_extend, rda_seeds) and `extra` adds variants to each."""
  pre = f"{extra}," if extra else ""
  for arg, table in tune:
    stage(arg, table)
  for i in range(1, extends + 1):
    if not stage(f"part={prefix}extend,{pre}results={results}", f"{prefix}extend{i}"):
      break
  for part in between:
    stage(f"part={part},{pre}results={results}", part)
  for part in (f"{prefix}seeds", *after):
    stage(f"part={part},{pre}seeds={seeds},results={results}", part)


Point = Callable[[Cell, float, int], dict[str, Any]]  # (cell, outer lr, seed) -> a sweep point
NEEDS_TUNE = "the sweep workdir holding part=tune's rows"


def stage_points(
    part: str,
    results: str,
    *,
    keys: Sequence[str],
    cells: Sequence[Cell],
    grid: Sequence[float],
    point: Point,
    rows: Callable[[], Sequence[Row]],
    seeds: Iterable[int] = (),
    seed_cells: Sequence[Cell] | None = None,
    extend: Callable[[Sequence[Row]], list[dict[str, Any]]] | None = None,
    more: (
        Mapping[str, Callable[[Sequence[Row], dict[Cell, float]], list[dict[str, Any]]]] | None
    ) = None,
    prefix: str = "",
    needs: str = NEEDS_TUNE,
    rate_major: bool = False,
    extend_tuned: bool = False,
) -> list[dict[str, Any]]:
  """The points of stage `part` of a sweep file's search over `cells` (get_sweep's answer).

  tune: every cell at every rate of `grid`, seed 0 (cell by cell; `rate_major`: rate by rate).
  The other parts read `rows()`, the finished rows of `results` (which they need), and every
  cell's winner (`extend_tuned`: extend takes the cells tuned so far). extend: one rung past
  each winner on the edge of its rates (`past_edges`; `extend(rows)` instead where given);
  seeds: each of `seed_cells` (default: every cell) at its winner for each of `seeds`; a part of
  `more`: its own points from the rows and the winners (seeds too, when `more` has it).
  `prefix` names a second search's parts (`rda_`).
  """
  more = more or {}
  stages = [f"{prefix}{p}" for p in ("tune", "extend", "seeds")]
  if part == stages[0] and rate_major:
    return [point(c, lr, 0) for lr in grid for c in cells]
  if part == stages[0]:
    return [point(c, lr, 0) for c in cells for lr in grid]
  known = tuple(dict.fromkeys((*stages, *more)))
  if part not in known:
    raise ValueError(f"unknown part {part!r}; known: {', '.join(known)}")
  if not results:
    raise ValueError(f"part={part} needs results=DIR, {needs}")
  finished = rows()
  if part == stages[1] and part not in more:
    if not extend_tuned:
      need_winners(finished, keys, cells, results)  # every cell tuned first
    if extend is not None:
      return extend(finished)
    return [point(tuple(e[:-1]), e[-1], 0) for e in past_edges(finished, keys, cells)]
  best = need_winners(finished, keys, cells, results)
  if part in more:
    return more[part](finished, best)
  seed_cells = cells if seed_cells is None else seed_cells
  return [point(c, best[c], s) for c in seed_cells for s in seeds]
