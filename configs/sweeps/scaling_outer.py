r"""Stage (b) of the scaling-laws study (configs/scaling_laws.py): the outer learning rate of DiLoCo
M = 1, 2, 4, 8 from the paper's grid {0.2, 0.4, 0.6, 0.8, 1.0}, for each (size, M), at that
cell's stage-(a) winner (inner lr and global batch), seed 0.

  python -m experiments.sweep --config=configs/sweeps/scaling_outer.py:sizes=s/m,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=outer --parallel=2
  python -m experiments.sweep --config=configs/sweeps/scaling_outer.py:part=reuse,from=m,sizes=l,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=outer_l --parallel=2

`part=grid`: the five rates at every (size, M) of `sizes` (0.6 is stage (a)'s own run: the same
point, not run twice). `part=reuse` (for a size too large to tune here): each M's winning rate at
size `from` and one neighbour (the next rate up, or down from 1.0): the paper's finding (4), the
best outer rate depends on M and not on N, is what makes the reuse sound, so the notebook checks it
on the tuned sizes and the neighbour checks it on this one. `results`: the sweep
workdir (every table in it is read).

`tiny`: sizes t1/t2, M = 2, rates 0.6 (stage (a)'s run) and 0.8, the test suite's version.
"""

import ml_collections

from configs import scaling_laws
from diloco.config import variants
from experiments.studies import scaling_protocol as sp

SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "wall_s")
SWEEP_ONLY = ("part", "sizes", "results", "from")


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, part="grid", sizes="", results="", **{"from": "m"})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return scaling_laws.run_config(arg, SWEEP_ONLY)


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  rows, sizes = scaling_laws.stage_rows(a)
  learners, grid = (sp.TINY_METHODS[1:], (0.6, 0.8)) if a.tiny else (sp.METHODS[1:], sp.OUTER_LRS)
  out = []
  for s in sizes:
    for m in learners:
      best = sp.inner_winner(rows, s, m)
      if best is None:
        raise ValueError(f"no stage-(a) rows of size {s}, M={m}")
      if a.part == "grid":
        rates = grid
      elif a.part == "reuse":
        lr = sp.outer_winner(rows, a["from"], m)
        if lr is None:
          raise ValueError(f"no stage-(b) rows of size {a['from']}, M={m} to reuse")
        i = grid.index(lr)
        rates = (lr, grid[i + 1] if i + 1 < len(grid) else grid[i - 1])
      else:
        raise ValueError(f"unknown part {a.part!r}; known: grid, reuse")
      out += [sp.point(s, m, *best, outer_lr=r, tiny=a.tiny) for r in rates]
  return list({repr(p): p for p in out}.values())
