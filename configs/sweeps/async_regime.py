r"""The Async Local-SGD table (Liu et al. 2024, arXiv 2401.09135) again, from a pretrained model as
theirs starts, in the README main job's regime, and each method at its own outer learning rate
(issue 32; configs/sweeps/async.py has the first table's design).

  W=runs/async_regime
  python -m experiments.sweep --config=configs/sweeps/async_regime.py:part=pretrain --workdir=$W --table=pretrain
  python -m experiments.sweep --config=configs/sweeps/async_regime.py:part=tune,results=$W --workdir=$W --table=tune --parallel=2
  python -m experiments.sweep --config=configs/sweeps/async_regime.py:part=extend,results=$W --workdir=$W --table=extend1 --parallel=2
  python -m experiments.sweep --config=configs/sweeps/async_regime.py:part=seeds,seeds=3,results=$W --workdir=$W --table=seeds --parallel=2

part=pretrain: one point, data-parallel on the tiny decoder (28,832 parameters), 1,000 steps of 64
sequences of 64 bytes (4.1 MB, 142 bytes per parameter) at inner lr 0.02 (the main job's tuned
data-parallel rate). Every other point starts from its final parameters (`init_from`, with a fresh
inner optimizer and schedule).
Then async.py's methods (sync, async, dn, dn_dylu, decoupled) with k = 4 learners at its four
heterogeneity levels, at async.py's budget=regime: 16 sequences of 64 bytes per learner step
(1 KB), H = 20, 4 x 2,000 steps' tokens (8.2 MB, whoever trains them), inner lr 1e-2, the whole
validation split. part=tune: every (method, level) at OUTER_LRS, seed 0, momentum 0.9 (the
paper's; not tuned here); part=extend: one rung past any winner on an edge (run until it adds
none); part=seeds: seed 1 (seeds=2; seeds=3 adds seed 2) of the cells that decide the paper's
findings (sync, async, dn_dylu) at their winners. `tiny`: the test suite's version (tiny budgets,
one rate, the none and very levels, seeds at very only).

`toy` (issue 55): the asynchronous baseline as its authors' toy runs it (google-deepmind/asyncdiloco,
AsyncLocalSGDToyExample.ipynb): every method but the Decoupled preset starts each round with a
fresh inner optimizer, its schedule at the steps all learners merged / 4 (the toy indexes it by
its data shard's progress), and the asynchronous ones hold a merge's contributors for a restart
window, then restart them together from the newest model. The toy's window is 0.5 s against a
fastest step of 0.58 s; ours is the same fraction of our fastest step (1 simulated second):
TOY_WINDOW_S. Its own workdir (pretrain again there):

  W=runs/async_toy
  python -m experiments.sweep --config=configs/sweeps/async_regime.py:part=pretrain,toy=1 --workdir=$W --table=pretrain
  python -m experiments.sweep --config=configs/sweeps/async_regime.py:part=tune,toy=1,results=$W --workdir=$W --table=tune --parallel=2
"""

import importlib
import os

import ml_collections

from configs import shakespeare
from diloco.config import variants
from experiments.studies import outer_lr_search as search, scaling_protocol as sp

base = importlib.import_module("configs.sweeps.async")  # `async` is a keyword

SWEEP_KEYS = base.SWEEP_KEYS
SWEEP_ONLY = ("part", "results", "seeds")
OUTER_LRS = (0.1, 0.2, 0.4)  # the first table's 0.4 made naive async diverge
TOY_WINDOW_S = round(0.5 / 0.58, 3)  # the toy's window over its fastest step, in our steps
KEYS = ("method", "hetero")
PRETRAIN = "stage=pretrain"  # the pretraining point's directory in the sweep's workdir
UNNAMED_KEYS = ("config.init_from",)  # a path under the workdir: not in the points' names


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      part="tune",
      results="",
      seeds=3,
      stage="train",
      method="sync",
      hetero="none",
      outer_lr=0.4,
      seed=0,
      toy=False,
  )


def _pretrain(tiny: bool) -> ml_collections.ConfigDict:
  c = shakespeare.get_config("mode=dp,model=tiny")
  steps, batch, seq = (12, 8, 32) if tiny else (1000, 64, 64)
  c.seq_len, c.batch_size, c.steps, c.model.max_len = seq, batch, steps, seq
  warmup = 2 if tiny else 50
  c.optimizer.update(dict(lr=2e-2, warmup_steps=warmup, decay_steps=steps - warmup))
  c.data.iid = True
  c.data.eval_sequences = 32 if tiny else 0
  c.data.final_eval_sequences = 64 if tiny else 0
  c.eval_every = c.checkpoint_every = steps
  return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(variants.drop(arg, SWEEP_ONLY))
  if a.stage == "pretrain":
    return _pretrain(a.tiny)
  if a.stage != "train":
    raise ValueError(f"stage={a.stage!r}: expected pretrain or train")
  point = f"method={a.method},hetero={a.hetero},outer_lr={a.outer_lr},seed={a.seed}"
  c = base.get_config(point + ",budget=regime" + (",tiny" if a.tiny else ""))
  if a.toy and a.method != "decoupled":  # (the preset's 24 fragments: not the toy's method)
    c.outer.update(dict(fresh_inner_optimizer=True, schedule_by="global"))
    if a.method != "sync":
      c.outer.restart_window_s = TOY_WINDOW_S
  return c


def _cells(tiny: bool) -> list[tuple[str, str]]:
  levels = ("none", "very") if tiny else tuple(base.HETERO)
  return [(m, lv) for lv in levels for m in base.METHODS]


def _point(cell, lr: float, seed: int, results: str) -> dict:
  start = {"config.init_from": os.path.join(os.path.abspath(results), PRETRAIN)}
  return dict(zip(KEYS, cell), outer_lr=lr, seed=seed, **start)


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  if a.part == "pretrain":
    return [dict(stage="pretrain")]
  if a.part not in ("tune", "extend", "seeds"):
    raise ValueError(f"unknown part {a.part!r}; known: pretrain, tune, extend, seeds")
  if not a.results or not os.path.isfile(os.path.join(a.results, PRETRAIN, "summary.json")):
    raise ValueError(
        f"part={a.part} needs results=DIR, the sweep workdir where part=pretrain finished"
        f" ({PRETRAIN}/summary.json); got {a.results!r}"
    )
  cells = _cells(a.tiny)
  deciding = [c for c in cells if c[0] in base.DECIDING and (c[1] == "very" or not a.tiny)]
  return search.stage_points(
      a.part,
      a.results,
      keys=KEYS,
      cells=cells,
      grid=OUTER_LRS[2:] if a.tiny else OUTER_LRS,
      point=lambda c, lr, seed: _point(c, lr, seed, a.results),
      rows=lambda: [r for r in sp.read_rows(a.results) if r.get("stage", "train") != "pretrain"],
      seeds=range(1, a.seeds),
      seed_cells=deciding,
      extend=(lambda rows: []) if a.tiny else None,
  )
