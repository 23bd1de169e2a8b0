r"""Decoupled DiLoCo's column of the scaling-laws study (configs/scaling_laws.py method=decoupled:
the Decoupled preset on rebase, K = 1 with grace, P = 4 fragments, H = 30, the second half of the M
learners 18% slower, 10% step jitter): M = 2, 4, 8 at every size, each at DiLoCo M's stage-(a)
winner (inner lr and global batch reused, not re-tuned) and its own outer learning rate.

  R=notebooks/results/scaling_paper
  python -m experiments.sweep --config=configs/sweeps/scaling_decoupled.py:part=tune,sizes=xs/s/m,results=$R \
      --workdir=$R --table=decoupled_tune --parallel=2
  python -m experiments.sweep --config=configs/sweeps/scaling_decoupled.py:part=extend,sizes=xs/s/m,results=$R \
      --workdir=$R --table=decoupled_extend1 --parallel=2    # until it adds no point
  python -m experiments.sweep --config=configs/sweeps/scaling_decoupled.py:part=seeds,sizes=xs/s/m,results=$R \
      --workdir=$R --table=decoupled_seeds --parallel=2

`part=tune`: the outer rates sp.DECOUPLED_OUTER_LRS (a doubling ladder) at seed 0; `part=extend`:
the next rung past a winner on the edge of what was tried; `part=seeds`: seeds 1 and 2 at each
winner. `results`: the sweep workdir holding stage (a)'s rows (and this column's so far).

`tiny`: sizes t1/t2, M = 2, one rate, seed 1 only, the test suite's version.
"""

import ml_collections

from configs import scaling_laws
from diloco.config import variants
from experiments.studies import outer_lr_search as search, scaling_protocol as sp

SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "merged_share")
SWEEP_ONLY = ("part", "sizes", "results")
PARTS = ("tune", "extend", "seeds")


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, part="tune", sizes="", results="")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return scaling_laws.run_config(arg, SWEEP_ONLY)


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  if a.part not in PARTS:
    raise ValueError(f"unknown part {a.part!r}; known: {', '.join(PARTS)}")
  rows, sizes = scaling_laws.stage_rows(a)
  methods = sp.TINY_DECOUPLED if a.tiny else sp.DECOUPLED
  keys = ("size", "learners")
  out = []
  for s in sizes:
    for m in methods:
      best = sp.inner_winner(rows, s, sp.learners_of(m))
      if best is None:
        raise ValueError(f"no stage-(a) rows of size {s}, M={sp.learners_of(m)} (DiLoCo's)")
      if a.part == "tune":
        rates = sp.DECOUPLED_OUTER_LRS[1:2] if a.tiny else sp.DECOUPLED_OUTER_LRS
        out += [sp.point(s, m, *best, outer_lr=r, tiny=a.tiny) for r in rates]
        continue
      cell = (s, sp.learners_of(m))
      mine = [  # this cell's rows at DiLoCo's winner (a run off it does not count)
          r
          for r in rows
          if sp.method_of(r) == m and r["size"] == s and (float(r["lr"]), int(r["batch"])) == best
      ]
      if a.part == "extend":
        out += [
            sp.point(s, m, *best, outer_lr=e[-1], tiny=a.tiny)
            for e in search.past_edges(mine, keys, [cell])
        ]
        continue
      lr = search.need_winners(mine, keys, [cell], a.results)[cell]
      seeds = (1,) if a.tiny else (1, 2)
      out += [sp.point(s, m, *best, seed=k, outer_lr=lr, tiny=a.tiny) for k in seeds]
  return out
