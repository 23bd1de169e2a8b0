r"""Decoupled DiLoCo's ablations again, in the README main job's regime and each row at its own best
outer learning rate (issue 32; configs/sweeps/ablations.py has the first table's design).

  python -m experiments.sweep --config=configs/sweeps/ablations_regime.py:part=tune \
      --workdir=runs/ablations_regime --table=tune --parallel=2
  python -m experiments.sweep --config=configs/sweeps/ablations_regime.py:part=extend,results=runs/ablations_regime \
      --workdir=runs/ablations_regime --table=extend1 --parallel=2     # until it adds no point
  python -m experiments.sweep --config=configs/sweeps/ablations_regime.py:part=fragments,results=runs/ablations_regime \
      --workdir=runs/ablations_regime --table=fragments --parallel=2
  python -m experiments.sweep --config=configs/sweeps/ablations_regime.py:part=seeds,results=runs/ablations_regime \
      --workdir=runs/ablations_regime --table=seeds --parallel=2

Every point is ablations.py's Decoupled preset at budget=regime: the tiny decoder (28,832
parameters), 16 sequences of 64 bytes per learner step (1 KB), H = 20, 2,000 steps per learner
(100 syncs of each fragment; 16.4 MB and 568 bytes per parameter at M = 8, twice at M = 16), inner
lr 1e-2 (the main job's tuned Decoupled rate), P = 4 balanced fragments, equal speeds with a 10%
step jitter, scored on the whole validation split. The first table ran at 0.35 bytes per parameter
with one outer lr for every row, where whatever shortens the outer step wins.

Cells (changes from the baseline, M = 8 with RDA and the fp4 uplink):
  tuned     the merge rule at M = 8 and 16 (mean, RDA) and the uplink codecs that change the
            update's length (fp32, 2-bit, 1-bit): the outer lr from OUTER_LRS at seed 0
            (part=tune), one rung past any winner on an edge (part=extend)
  fragments by layer (strided, P = 2: one block each) and finer (balanced, P = 8), at the
            baseline's winning outer lr (the fragmentation does not change the update's length)
part=seeds: seed 1 of every cell at its outer lr (seeds=3: seeds 1 and 2 of every cell, the run to
make when a paired difference sits within the seed spread, as it did here). `tiny`: the test
suite's version (tiny budgets, one rate, M = 8 only, seeds of the merge rule's two cells only).
"""

import ml_collections

from configs.sweeps import ablations
from diloco.config import variants
from experiments.studies import outer_lr_search as search, scaling_protocol as sp

SWEEP_KEYS = ablations.SWEEP_KEYS
SWEEP_ONLY = ("part", "results", "seeds")
# 0.8 was in the grid until every cell run at 0.2 and 0.4 did better at 0.2 (12 points); with two
# rates each winner sits on an edge, so part=extend takes one rung past it either way.
OUTER_LRS = (0.2, 0.4)
KEYS = ("learners", "merge", "codec", "frag")  # a cell
BASE_CELL = (8, "rda", "fp4", "balanced")
TUNED = (
    BASE_CELL,
    (8, "mean", "fp4", "balanced"),
    (16, "rda", "fp4", "balanced"),
    (16, "mean", "fp4", "balanced"),
    (8, "rda", "fp32", "balanced"),
    (8, "rda", "2bit", "balanced"),
    (8, "rda", "1bit", "balanced"),
)
FRAGMENTS = ((8, "rda", "fp4", "layer"), (8, "rda", "fp4", "fine"))


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      part="tune",
      results="",
      seeds=2,
      learners=8,
      merge="rda",
      codec="fp4",
      frag="balanced",
      outer_lr=0.4,
      seed=0,
  )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(variants.drop(arg, SWEEP_ONLY))
  point = f"learners={a.learners},merge={a.merge},codec={a.codec},frag={a.frag}"
  point += f",outer_lr={a.outer_lr},seed={a.seed}" + (",tiny" if a.tiny else "")
  c = ablations.get_config(point + ",budget=regime")
  # Learners one after the other: at 16 x 64 bytes per learner the stacked step ran this sweep's
  # M = 8 Decoupled run at 0.57x of sequential (scripts/bench_stacked.py, BENCHMARKS.md).
  c.outer.stack_learners = "off"
  return c


def _points(cells, lr_of, seeds=(0,)) -> list[dict]:
  return [dict(zip(KEYS, cell), outer_lr=lr_of(cell), seed=s) for cell in cells for s in seeds]


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  tuned = [c for c in TUNED if not a.tiny or c[0] == 8]  # tiny: M = 16 compiles its own step
  frags = [c for c in FRAGMENTS if not a.tiny or c[3] == "layer"]  # tiny: P <= 2, no "fine"

  def seeds(rows, best) -> list[dict]:  # the tuned cells and the fragment kinds, at the winners
    lr_of = lambda c: best[c] if c in best else best[BASE_CELL]
    cells = TUNED[:2] if a.tiny else tuned + frags  # tiny: the merge rule's two cells (time)
    return _points(cells, lr_of, range(1, a.seeds))

  return search.stage_points(
      a.part,
      a.results,
      keys=KEYS,
      cells=tuned,
      grid=OUTER_LRS[1:2] if a.tiny else OUTER_LRS,
      point=lambda c, lr, seed: _points([c], lambda _: lr, (seed,))[0],
      rows=lambda: sp.read_rows(a.results),
      extend=(lambda rows: []) if a.tiny else None,
      more={
          "fragments": lambda rows, best: _points(frags, lambda c: best[BASE_CELL]),
          "seeds": seeds,
      },
      rate_major=True,
  )
