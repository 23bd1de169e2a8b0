r"""Stage (a) of the scaling-laws study (configs/scaling_laws.py): the peak inner learning rate x the
global batch, for each size and for data-parallel and DiLoCo M = 1, 2, 4, 8 apart, at a fixed outer
learning rate (0.6, the middle of the paper's grid), seed 0.

  python -m experiments.sweep --config=configs/sweeps/scaling_inner.py:sizes=s/m \
      --workdir=runs/scaling_paper --table=inner --parallel=2
  python -m experiments.sweep --config=configs/sweeps/scaling_inner.py:sizes=s/m,part=extend,results=runs/scaling_paper/inner.jsonl \
      --workdir=runs/scaling_paper --table=inner_extend --parallel=2     (again until it adds none)

`part=grid`: the learning rates LRS (a sqrt(2) ladder around 2e-2, the winner of the regime study at
17 bytes per parameter) x BATCHES (powers of 2) for every (size, method). `part=extend`: reads the
finished rows (`results`, one or more tables joined by '/') and, for every (size, method) whose
best cell sits on an edge of what was tried, adds the neighbour past that edge (the next rate of
the ladder at the winning batch, or the next batch at the winning rate); a batch below M sequences
cannot be split over M learners and is not added (that edge is then reported as such by the
notebook). Run it until it adds no point: every winner is then interior or at that limit.

`tiny`: sizes t1/t2, two rates, two batches, dp and M = 2 only, the test suite's version.
"""

import json
import math

import ml_collections

from configs import scaling_laws
from diloco.config import variants

LRS = tuple(round(2e-2 * math.sqrt(2) ** k, 6) for k in (-1, 0, 1))  # 1.41e-2, 2e-2, 2.83e-2
BATCHES = (8, 16, 32)
LEARNERS = (1, 2, 4, 8)
OUTER_LR = 0.6
SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "wall_s")


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, part="grid", sizes="s/m/l", results="")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return scaling_laws.run_config(arg, ("part", "sizes", "results"))


def methods(tiny: bool = False) -> list[tuple[str, int]]:
  """(method, M) of every compared method: data-parallel (M = 1 island) and DiLoCo M."""
  return [("dp", 1)] + [("diloco", m) for m in ((2,) if tiny else LEARNERS)]


def point(size: str, method: tuple[str, int], lr: float, batch: int, tiny: bool = False) -> dict:
  name, m = method
  out = {"size": size, "method": name, "lr": lr, "batch": batch, "seed": 0}
  if name == "diloco":
    out.update(learners=m, outer_lr=OUTER_LR)
  return {**out, "tiny": True} if tiny else out


def read_rows(paths: str) -> list[dict]:
  """The rows of one or more sweep tables (PATH/PATH...), finished ones only."""
  rows = []
  for path in filter(None, paths.split("/")):
    with open(path, encoding="utf-8") as f:
      rows += [json.loads(line) for line in f if line.strip()]
  return [r for r in rows if r.get("status") == "done"]


def cells(rows: list[dict], size: str, method: tuple[str, int], **fixed) -> dict:
  """(lr, batch) -> the row of each finished stage-(a) cell of (size, method) (seed 0)."""
  name, m = method
  out = {}
  for r in rows:
    if r.get("size") != size or r.get("method") != name or r.get("seed", 0) != 0:
      continue
    if name == "diloco" and (r.get("learners") != m or r.get("outer_lr") != OUTER_LR):
      continue
    if all(r.get(k) == v for k, v in fixed.items()):
      out[(float(r["lr"]), int(r["batch"]))] = r
  return out


def winner(rows: list[dict], size: str, method: tuple[str, int]) -> tuple[float, int] | None:
  """The (lr, batch) of the lowest final eval loss of (size, method), or None."""
  got = cells(rows, size, method)
  return min(got, key=lambda k: got[k]["eval_loss"]) if got else None


def neighbours(rows: list[dict], size: str, method: tuple[str, int]) -> list[tuple[float, int]]:
  """The cells past the edges the winner of (size, method) sits on (see the module doc)."""
  best = winner(rows, size, method)
  if best is None:
    return []
  got = cells(rows, size, method)
  lr, batch = best
  lrs = sorted({l for l, b in got if b == batch})
  batches = sorted({b for l, b in got if l == lr})
  out = []
  if lr == lrs[0]:
    out.append((round(lr / math.sqrt(2), 6), batch))
  if lr == lrs[-1]:
    out.append((round(lr * math.sqrt(2), 6), batch))
  if batch == batches[0] and batch // 2 >= method[1]:
    out.append((lr, batch // 2))
  if batch == batches[-1]:
    out.append((lr, batch * 2))
  return [c for c in out if c not in got]


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  sizes = list(scaling_laws.sizes(a.tiny)) if a.tiny else a.sizes.split("/")
  lrs, batches = (LRS[:2], BATCHES[:2]) if a.tiny else (LRS, BATCHES)
  out = []
  if a.part == "grid":
    for s in sizes:
      for method in methods(a.tiny):
        out += [point(s, method, lr, b, a.tiny) for lr in lrs for b in batches if b >= method[1]]
  elif a.part == "extend":
    if not a.results:
      raise ValueError("part=extend needs results=PATH[/PATH...], the stage's tables so far")
    rows = read_rows(a.results)
    for s in sizes:
      for method in methods(a.tiny):
        out += [point(s, method, lr, b, a.tiny) for lr, b in neighbours(rows, s, method)]
  else:
    raise ValueError(f"unknown part {a.part!r}; known: grid, extend")
  return list({repr(p): p for p in out}.values())  # a point named twice runs once
