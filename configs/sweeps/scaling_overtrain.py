r"""Stage (d) of the scaling-laws study (configs/scaling_laws.py): every winning cell trained on 4x
the tokens (D = 80 N), not re-tuned, as the paper's overtraining check did; seed 0.

  python -m experiments.sweep --config=configs/sweeps/scaling_overtrain.py:sizes=s/m,results=runs/scaling_paper \
      --workdir=runs/scaling_paper --table=overtrain --parallel=2

`tiny`: sizes t1/t2, dp and M = 2, the test suite's version.
"""

import ml_collections

from configs import scaling_laws
from diloco.config import variants
from diloco.studies import scaling_protocol as sp

SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "steps", "outer_steps", "wall_s")
SWEEP_ONLY = ("sizes", "results")


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
  methods = ("dp", 2) if a.tiny else sp.METHODS
  return [sp.winning_point(rows, s, m, overtrain=4, tiny=a.tiny) for s in sizes for m in methods]
