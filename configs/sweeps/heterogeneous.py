r"""Decoupled DiLoCo on heterogeneous hardware, as the paper ran it with 4 TPU v6e and 4 v5p learners
(about 2x apart in speed), on the simulated clock. Commands (notebooks/decoupled_ablations.py reads
the table; results are checked in under notebooks/results/heterogeneous/):

  python -m experiments.sweep --config=configs/sweeps/heterogeneous.py:part=tune \
      --workdir=runs/heterogeneous --table=tune --parallel=2
  python -m experiments.sweep --config=configs/sweeps/heterogeneous.py:part=extend,results=runs/heterogeneous \
      --workdir=runs/heterogeneous --table=extend1 --parallel=2     # until it adds no point
  python -m experiments.sweep --config=configs/sweeps/heterogeneous.py:part=seeds,results=runs/heterogeneous \
      --workdir=runs/heterogeneous --table=seeds --parallel=2

Eight learners; learners 4-7 take twice as long per step (sim.speeds 1,1,1,1,2,2,2,2), every step
with a 10% log-normal jitter. The synchronizer's policy (policy=...):
  wait_all   quorum K = 8 and blocking learners: a fragment merges once every learner uploaded it,
             and a learner waits for its merged fragment before going on (the paper's "waiting for
             all")
  k1         K = 1 without the grace window: a fragment merges on its first upload; no learner waits
  k1_grace   K = 1 with the adaptive grace window (gamma 0.8, the Decoupled preset's)
Everything else is the Decoupled preset (token weights, RDA, fp4 uplink, overlap 2, staleness
damping, clipping at 4x the median norm), P = 4 balanced fragments each synced every H = 20 steps.

domain=text: the README main job's regime (configs/shakespeare.py mode=compare): the tiny decoder
(28,832 parameters), 16 sequences of 64 bytes per learner step (1 KB), inner AdamW lr 0.01 (the main
job's tuned Decoupled rate), a budget of 8 x 1,000 such steps (8.2 MB, 284 bytes per parameter;
at equal speeds 50 syncs of each fragment per learner), scored on the whole validation split.
domain=vision: configs/digits.py's vit_small on the 8x8 digits, 8 images per learner step, inner lr
3e-3, a budget of 8 x 1,000 steps (64,000 images, 44 epochs), scored on the 359 held-out images
(loss and accuracy).
Equal tokens: a run ends when its budget is trained on, whoever trained it, so under K = 1 the
fast learners take more of the steps; under wait_all everyone takes 1,000 and the fast ones wait.

Each (domain, policy) runs at its own best outer learning rate: part=tune tries OUTER_LRS at seed 0,
part=extend adds the next rung beyond a winner on the grid's edge (run it until it adds none), and
part=seeds runs seeds 1 and 2 at every winner (seeds=2: seed 1 only). `tiny`: a few seconds per run (tiny models, 12 steps,
one rate, not extended, seeds of the text cells only), the test suite's version.
"""

import ml_collections

from configs import digits, shakespeare
from diloco.config import variants
from experiments.studies import outer_lr_search as search, scaling_protocol as sp
from experiments.studies.hetero_table import DOMAINS, KEYS, POLICIES  # (the table's)

SWEEP_KEYS = ("eval_loss", "eval_accuracy", "goodput", "sim_time_s", "merges", "mean_quorum")
SWEEP_ONLY = ("part", "results", "seeds")
LEARNERS = 8
SPEEDS = (1, 1, 1, 1, 2, 2, 2, 2)
OUTER_LRS = (0.2, 0.4, 0.8)  # a doubling ladder; part=extend goes on past an edge
STEPS, H, FRAGMENTS = 1000, 20, 4


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      part="tune",
      results="",
      seeds=3,
      domain="text",
      policy="k1_grace",
      outer_lr=0.4,
      seed=0,
  )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(variants.drop(arg, SWEEP_ONLY))
  if a.policy not in POLICIES:
    raise ValueError(f"policy={a.policy!r}: expected one of {POLICIES}")
  if a.domain not in DOMAINS:
    raise ValueError(f"domain={a.domain!r}: expected one of {DOMAINS}")
  steps = 12 if a.tiny else STEPS
  h = 3 if a.tiny else H
  if a.domain == "text":
    c = shakespeare.get_config(f"mode=decoupled,model=tiny,learners={LEARNERS}")
    (seq, per), lr = ((32, 2) if a.tiny else (64, 16)), 1e-2
    c.seq_len, c.batch_size, c.model.max_len = seq, per, seq
    c.data.eval_sequences = 32 if a.tiny else 0
    c.data.final_eval_sequences = 64 if a.tiny else 0  # 0: the whole validation split
  else:
    c = digits.get_config(f"mode=decoupled,learners={LEARNERS}" + (",model=vit_tiny" * a.tiny))
    c.batch_size, lr = (2 if a.tiny else 8), 3e-3
  warmup = 2 if a.tiny else 50
  c.seed, c.steps = a.seed, steps
  c.optimizer.update(dict(lr=lr, warmup_steps=warmup, decay_steps=steps - warmup))
  c.data.iid = True
  c.outer.update(dict(inner_steps=h, fragments=2 if a.tiny else FRAGMENTS, lr=a.outer_lr))
  c.outer.delivery = "replace"  # issue 32's table (delivery.py sweeps the rules over this run)
  c.outer.fragment_kind = "balanced"
  c.outer.merge_clock = "arrival"  # these tables' clock (the Decoupled preset's until issue 69)
  if a.policy == "wait_all":
    c.outer.update(dict(quorum=LEARNERS, blocking=True, grace_gamma=0.0))
  else:
    c.outer.update(dict(quorum=1, grace_gamma=0.8 if a.policy == "k1_grace" else 0.0))
  c.sim.speeds = ",".join(str(s) for s in SPEEDS)
  c.sim.step_jitter = 0.1
  c.log_every = max(steps // 30, 1)
  c.eval_every = steps
  c.checkpoint_every = steps
  c.timeline = False
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  cells = [(d, p) for d in DOMAINS for p in POLICIES]
  return search.stage_points(
      a.part,
      a.results,
      keys=KEYS,
      cells=cells,
      grid=OUTER_LRS[1:2] if a.tiny else OUTER_LRS,
      point=lambda c, lr, seed: dict(domain=c[0], policy=c[1], outer_lr=lr, seed=seed),
      rows=lambda: sp.read_rows(a.results),
      seeds=range(1, a.seeds),
      seed_cells=[c for c in cells if not a.tiny or c[0] == "text"],  # tiny: text's seeds (time)
      extend=(lambda rows: []) if a.tiny else None,  # tiny: one rate, not extended (time)
  )
