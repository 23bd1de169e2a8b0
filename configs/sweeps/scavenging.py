r"""The scavenging table (issue 55 point 2): a Decoupled DiLoCo run of 4 learners that 1, 2, 4 or 12
more learners join for a stretch of it (+25, +50, +100, +300% of its compute while they are
there), on the simulated clock; the time each run takes to reach the 4-learner run's final
evaluation loss, relative to that run's (experiments/studies/scavenging_table.py, notebooks/scavenging.py).

  python -m experiments.sweep --config=configs/sweeps/scavenging.py:seeds=3 --workdir=runs/scavenging --parallel=2

The 4 learners are the README main job's Decoupled DiLoCo at M = 4: the tiny decoder, 1,000 steps
of 16 sequences of 64 bytes each (4,096,000 bytes, the main job's budget), P = 4 fragments each
synced every H = 20 steps, inner lr 1e-2 (Decoupled's winner in the main job's grid), the
preset's outer rate 0.1, with the paper's heterogeneity (the second two 18% slower per step,
every step with a 10% log-normal jitter), i.i.d. data (each learner's stream depends on the seed
and its index only, so the 4 see the same batches in every row). `extra=k` adds k learners of
speed 1 from 25% to 75% of the nominal run (simulated s 250 to 750), each starting its
learning-rate schedule where the clock is (`sim.join_schedule=clock`: a learner lent to a run
joins it mid-schedule, not at warmup). A run with extras ends at 1.2x the nominal time
(`sim.time_limit_s`; the 4-learner run ends at about 1.08x, on its budget); one that has not
reached the target by then is reported as such. Every run evaluates the global model on the same
1,024 validation sequences about every 48 learner steps (all learners together) and at the end.
`tiny`: the test suite's version (the tiny decoder at 24 steps of 8 x 32 bytes, extra 0 and 2).

`outer_lr=X` runs every point at outer rate X instead of the preset's 0.1 (the check of why more
extra learners gained less: half the rate, one seed, its own workdir):

  python -m experiments.sweep --config=configs/sweeps/scavenging.py:seeds=1,outer_lr=0.05 --workdir=runs/scavenging_lr005 --parallel=1
"""

import ml_collections

from configs import shakespeare
from diloco.config import variants

SWEEP_KEYS = ("eval_loss", "sim_time_s", "eval_curve", "tokens", "learners", "merges", "finished")
SWEEP_ONLY = ("seeds",)
BASE = 4  # the run's own learners
EXTRAS = (0, 1, 2, 4, 12)  # +25% each: +25, +50, +100, +300%
SLOWER, JITTER = 1.18, 0.1  # the paper's heterogeneous setting (configs/scaling_laws.py)
STRETCH = (0.25, 0.75)  # the extras' stretch, as shares of the nominal run (steps x 1 s)
TIME_LIMIT = 1.2  # runs with extras stop here, a share of the nominal run
EVAL_STEPS = 48  # learner steps (all learners together) between evaluations
EVAL_SEQS = 1024


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, extra=0, seed=0, outer_lr=0.1)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(variants.drop(arg, SWEEP_ONLY))
  if a.extra < 0:
    raise ValueError(f"extra={a.extra}: expected a number of extra learners >= 0")
  m = BASE + a.extra
  steps, batch, seq = (24, 8, 32) if a.tiny else (1000, 16, 64)
  c = shakespeare.get_config(f"mode=decoupled,model=tiny,learners={m}")
  c.outer.merge_clock = "arrival"  # these tables' clock (the Decoupled preset's until issue 69)
  c.seed, c.steps, c.batch_size, c.seq_len, c.model.max_len = a.seed, steps, batch, seq, seq
  warmup = 2 if a.tiny else 50
  c.optimizer.update(dict(lr=1e-2, warmup_steps=warmup, decay_steps=steps - warmup))
  c.outer.update(dict(fragments=2 if a.tiny else 4, inner_steps=4 if a.tiny else 20))
  c.outer.lr = a.outer_lr  # the preset's 0.1 unless told
  c.data.iid = True
  c.data.eval_sequences = c.data.final_eval_sequences = 32 if a.tiny else EVAL_SEQS
  start, stop = (round(s * steps * c.sim.step_s, 3) for s in STRETCH)
  c.sim.speeds = ",".join(["1", "1", f"{SLOWER:g}", f"{SLOWER:g}"] + ["1"] * a.extra)
  c.sim.step_jitter = JITTER
  if a.extra:
    c.sim.start_times = ",".join(["0"] * BASE + [f"{start:g}"] * a.extra)
    c.sim.stop_times = ",".join(["0"] * BASE + [f"{stop:g}"] * a.extra)
    c.sim.join_schedule = "clock"
    c.sim.time_limit_s = TIME_LIMIT * steps * c.sim.step_s
  c.eval_every = max(round(EVAL_STEPS / m), 1) if not a.tiny else 2
  c.log_every = max(steps // 20, 1)
  c.checkpoint_every = steps
  c.progress_bar = False
  c.timeline = False
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  a = variants.parse_arg(arg, tiny=False, seeds=1, outer_lr=0.1)
  extras = (0, 2) if a.tiny else EXTRAS
  return [dict(extra=k, seed=s) for s in range(a.seeds) for k in extras]
