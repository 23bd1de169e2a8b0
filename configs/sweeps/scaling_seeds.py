r"""Stage (c) of the scaling-laws study (configs/scaling_laws.py): seeds 1 and 2 of every winning
cell (data-parallel and DiLoCo M at each size: inner lr and batch from stage (a), DiLoCo's outer lr
from stage (b)); seed 0 is the tuning run itself.

  python -m experiments.sweep --config=configs/sweeps/scaling_seeds.py:sizes=s/m,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=seeds --parallel=2

`tiny`: sizes t1/t2, dp and M = 2, seed 1 only, the test suite's version.
"""

import ml_collections

from configs import scaling_laws
from diloco.config import variants
from diloco.studies import scaling_protocol as sp

SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "wall_s")
SWEEP_ONLY = ("sizes", "results")
SEEDS = (1, 2)


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, sizes="", results="")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return scaling_laws.run_config(arg, SWEEP_ONLY)


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  if not a.results:
    raise ValueError(
        "needs results=DIR: the sweep workdir whose tables (*.jsonl) hold stages (a) and (b)"
    )
  rows = sp.read_rows(a.results)
  sizes = scaling_laws.swept_sizes(a.sizes, a.tiny)
  methods, seeds = (("dp", 2), SEEDS[:1]) if a.tiny else (sp.METHODS, SEEDS)
  return [
      sp.winning_point(rows, s, method, seed=seed, tiny=a.tiny)
      for s in sizes
      for method in methods
      for seed in seeds
  ]
