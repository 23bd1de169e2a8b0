r"""Language modelling on Shakespeare's plays (byte-level), the project's default job.

The README's main job compares data-parallel, synchronous DiLoCo and Decoupled DiLoCo:

  python -m experiments.train --config=configs/shakespeare.py:mode=compare --workdir=runs/default

Variants after the colon, comma-separated (e.g. `configs/shakespeare.py:model=tiny,runlocal`):
  mode=dp          one island, data-parallel SPMD over every local device (the default mode).
  mode=diloco      M learners, all synced every H steps, mean, Nesterov outer step.
  mode=streaming   Streaming DiLoCo: P fragments at staggered offsets, overlap tau, fp4.
  mode=decoupled   Decoupled DiLoCo: quorum K, adaptive grace, token weights, RDA, each fragment
                   merged once per period of the fast learners' pace; never waits.
  mode=compare     dp, diloco and decoupled on one token budget, the last learner 3x slower, each
                   at its own tuned inner lr (compare.inner_lrs); prints a table (with the
                   held-out shakespeare_line_end task's accuracy: eval.harness_tasks, pip install
                   -e '.[eval]') and draws compare.png (diloco/config/presets.py).
  model=tiny|small|base   tiny ~29k params (tests), small ~0.89M (default), base ~27M;
  model=35m|90m|180m      the DiLoCo scaling-laws shapes (19M, 64M, 151M params with bytes).
                   model.dtype (bfloat16: compute; weights and optimizer stay float32),
                   model.attention (einsum | dot_product_attention | cudnn) and model.remat
                   (none | block | dots) choose the step's numerics, kernel and memory.
  runlocal         shrink everything to a few seconds on a laptop (tiny model, 40 steps).
  steps=N          inner steps per learner; batch=N batch per learner (sequences); seq=N bytes.
  learners=N       M, the number of learners (islands).
  chaos=none|light|heavy|<fault lines>|<file>   a fault schedule (diloco/chaos/schedule.py); turns on
                   learner checkpoints every H steps, synchronizer checkpoints every P merges and
                   max_staleness = 4M. light/heavy are seeded Poisson schedules drawn over 4x the
                   nominal run (steps x sim.step_s), shaped by the chaos section below.
  recipe=charles2025   the inner optimizer and model of the DiLoCo scaling-laws paper (Charles et
                   al. 2025) over any mode: AdamW beta2 0.99, cosine to 5% of the peak lr,
                   independent weight decay 1/T (T = steps), QK-norm, output z-loss 1e-4
                   (declared on each key it sets; each key stays overridable).

Each variant is a key (mode, model.size, runlocal, steps, batch_size, seq_len, outer.learners,
chaos.schedule, recipe), so `:mode=decoupled` and `--config.mode=decoupled` are the same run. Any
key can be overridden on the command line, e.g. `--config.optimizer.lr=1e-3`; unknown keys fail
(the config is locked). Keys marked preset are filled by the mode, `runlocal`, the recipe or
another key (the decay steps follow `steps`) until given; `python -m experiments.config
--config=configs/shakespeare.py:VARIANTS` prints every key, its value, where it came from and what
it means.

Expected on 2 CPU cores (BENCHMARKS.md has measured figures): mode=dp, small model, 300 steps of
32x128 bytes reaches about 2.7 bits per byte in 2-3 minutes. mode=compare (the tiny model, 28,832
parameters; M=2 learners of 16x64 bytes a step, 2,000 steps, H=20: 100 outer steps, 142 bytes per
parameter; each method at the inner lr that won configs/sweeps/main_job.py) ends at about 2.66
(dp), 2.67 (DiLoCo) and 2.72 (Decoupled DiLoCo) bits per byte on the whole validation split (the
README's table).
"""

import ml_collections

from diloco.config import base, resolve, variants

# variant -> key: a variant after the colon sets its key as a --config flag would.
VARIANTS = {
    "mode": "mode",
    "model": "model.size",
    "runlocal": "runlocal",
    "steps": "steps",
    "batch": "batch_size",
    "seq": "seq_len",
    "learners": "outer.learners",
    "chaos": "chaos.schedule",
    "recipe": "recipe",
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = base.base_config()
  variants.apply(c, arg, VARIANTS)
  c.lock()
  return resolve.resolve(c)
