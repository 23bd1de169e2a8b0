r"""Stage (d) of the scaling-laws study (configs/scaling_laws.py): every winning cell trained on 4x
the tokens (D = 80 N), not re-tuned, as the paper's overtraining check did; seed 0.

  python -m experiments.sweep --config=configs/sweeps/scaling_overtrain.py:sizes=s/m,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=overtrain --parallel=2

`tiny`: sizes t1/t2, dp and M = 2, the test suite's version.
"""

import ml_collections

from configs import scaling_laws

SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "wall_s")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return scaling_laws.run_config(arg, ("sizes", "results"))


def get_sweep(arg: str | None = None) -> list[dict]:
  return scaling_laws.winner_points(arg, seeds=(0,), overtrain=4)
