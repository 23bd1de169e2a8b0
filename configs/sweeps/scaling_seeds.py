r"""Stage (c) of the scaling-laws study (configs/scaling_laws.py): seeds 1 and 2 of every winning
cell (data-parallel and DiLoCo M at each size: inner lr and batch from stage (a), DiLoCo's outer lr
from stage (b)); seed 0 is the tuning run itself.

  python -m experiments.sweep --config=configs/sweeps/scaling_seeds.py:sizes=s/m,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=seeds --parallel=2

`tiny`: sizes t1/t2, dp and M = 2, seed 1 only, the test suite's version.
"""

import ml_collections

from configs import scaling_laws

SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "wall_s")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return scaling_laws.run_config(arg, ("sizes", "results"))


def get_sweep(arg: str | None = None) -> list[dict]:
  return scaling_laws.winner_points(arg, seeds=(1, 2), overtrain=1)
