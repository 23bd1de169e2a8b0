r"""Stage (a) of the scaling-laws study (configs/scaling_laws.py): the peak inner learning rate x the
global batch, for each size and for data-parallel and DiLoCo M = 1, 2, 4, 8 apart, at a fixed outer
learning rate (0.6, the middle of the paper's grid), seed 0.

  python -m experiments.sweep --config=configs/sweeps/scaling_inner.py:sizes=s/m \
      --workdir=runs/scaling_paper --table=inner --parallel=2
  python -m experiments.sweep --config=configs/sweeps/scaling_inner.py:sizes=s/m,part=extend,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=inner_extend1 --parallel=2
  (then --table=inner_extend2, and so on, until it adds no point)
  python -m experiments.sweep --config=configs/sweeps/scaling_inner.py:sizes=l,part=transfer,donor=m,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=inner_l_transfer --parallel=2
  (a larger size started at the smaller one's winners, then part=extend as above)

`part=grid`: the learning rates LRS (a sqrt(2) ladder around 2e-2, the winner of the regime study at
17 bytes per parameter) x BATCHES (powers of 2) for every (size, method). `part=extend`: reads the
finished rows of every table in the sweep workdir `results` and, for every (size, method), adds
the cells of its winner's 3 x 3 neighbourhood (rate / sqrt(2), rate, rate x sqrt(2) at half, the
same and twice the batch) not tried yet (experiments/studies/scaling_protocol.py `edge_neighbours`); a
batch below M sequences cannot be split over M learners and is not added. Run it until it adds
no point (the sweep then refuses an empty list): every winner then beats all its neighbours,
diagonals included (a smaller batch wants a smaller rate: one axis at a time stops short).
`part=transfer,donor=D`: instead of the fixed grid, one cell per (size, method): the winner of the
same method at the finished size D (read from `results`), the centre `part=extend` grows from.
At sizes s and m the winners sat at 0.25-1x the grid's lowest rate and 1/8-1x its smallest batch,
found after 8 and 5 extension rounds (14-33 cells per method), which a size of 8x the compute per
run cannot afford to repeat; where the optimum moves, the extension rounds follow it as before.

`tiny`: sizes t1/t2, one rate, one batch, dp and M = 2 only, the test suite's version (each
rate is a train step of its own to compile).
"""

import ml_collections

from configs import scaling_laws
from diloco.config import variants
from experiments.studies import scaling_protocol as sp

LRS = tuple(sp.rung(k) for k in (-1, 0, 1))  # 1.41e-2, 2e-2, 2.83e-2
BATCHES = (8, 16, 32)
SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "wall_s")
SWEEP_ONLY = ("part", "sizes", "results", "donor")


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, part="grid", sizes="", results="", donor="")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return scaling_laws.run_config(arg, SWEEP_ONLY)


def methods(tiny: bool = False) -> tuple[sp.Method, ...]:
  return sp.TINY_METHODS if tiny else sp.METHODS


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  lrs, batches = (LRS[1:2], BATCHES[:1]) if a.tiny else (LRS, BATCHES)
  out = []
  if a.part == "grid":
    for s in scaling_laws.swept_sizes(a.sizes, a.tiny):
      for method in methods(a.tiny):
        m = 1 if method == "dp" else method
        out += [sp.point(s, method, lr, b, tiny=a.tiny) for lr in lrs for b in batches if b >= m]
  elif a.part in ("extend", "transfer"):
    if not a.results:
      raise ValueError(
          f"part={a.part} needs results=DIR, the sweep workdir whose tables (*.jsonl) hold the rows"
          " so far"
      )
    rows = sp.read_rows(a.results)
    if a.part == "transfer":
      return _transferred(rows, a)
    for s in scaling_laws.swept_sizes(a.sizes, a.tiny):
      for method in methods(a.tiny):
        out += [
            sp.point(s, method, lr, b, tiny=a.tiny) for lr, b in sp.edge_neighbours(rows, s, method)
        ]
  else:
    raise ValueError(f"unknown part {a.part!r}; known: grid, extend, transfer")
  return list({repr(p): p for p in out}.values())  # a point named twice runs once


def _transferred(rows: list[dict], a: ml_collections.ConfigDict) -> list[dict]:
  """Every (size, method)'s first cell: the donor size's winner of that method."""
  known = scaling_laws.sizes(a.tiny)
  if a.donor not in known:
    raise ValueError(f"part=transfer needs donor=SIZE, one of {sorted(known)}; got {a.donor!r}")
  out = []
  for method in methods(a.tiny):
    best = sp.inner_winner(rows, a.donor, method)
    if best is None:
      raise ValueError(f"no stage-(a) rows of size {a.donor} and method {method} to transfer")
    for s in scaling_laws.swept_sizes(a.sizes, a.tiny):
      out.append(sp.point(s, method, best[0], best[1], tiny=a.tiny))
  return out
