r"""Chaos suite: many short seeded Decoupled DiLoCo runs under heavy faults, one table.

Command:

  python -m experiments.chaos_suite --config=configs/chaos_suite.py --workdir=runs/chaos_suite

Each run is `base_file` (configs/shakespeare.py) with
`runlocal,mode=decoupled,learners=4,steps=S,chaos=heavy` (tiny model) and chaos seed 0, 1, ...:
per learner a fault every quarter of the run on average (crash, straggle, delay, partition,
corrupt, poison), synchronizer crashes every half run on average, each lasting 5% of the run on
average. The table (WORKDIR/chaos_suite.md, also printed) has one row per
run: faults by kind, rejections by reason, rejoins, restarts, corrupted/poisoned messages caught,
and whether the global parameters stayed finite and uncorrupted, every crashed learner rejoined
and training advanced.

Variants after the colon: runs=N, steps=S, learners=M, mode=decoupled|diloco, preset=heavy|light.
The test suite runs a one-run version (tests/test_recovery.py).

Expected (default variants, schedules drawn over 4x the nominal run since chaos.SPAN): 8 runs, 159
faults injected across all seven kinds, no run failing a verdict; about 105 CPU-seconds (user +
system), which took 20 minutes of wall time on the shared 2-core CPU at a load average of 18-19.
"""

import ml_collections

from diloco.config import variants


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = variants.parse_arg(arg, runs=8, steps=120, learners=4, mode="decoupled", preset="heavy")
  if arg.runs < 1:
    raise ValueError(f"runs must be >= 1, got {arg.runs}")
  c = ml_collections.ConfigDict()
  c.base_file = "configs/shakespeare.py"  # each run's config file (from the working directory)
  c.base = f"runlocal,mode={arg.mode},learners={arg.learners},steps={arg.steps},chaos={arg.preset}"
  c.runs = arg.runs
  c.seed0 = 0  # chaos seeds seed0 .. seed0 + runs - 1
  c.step_jitter = 0.2  # learners' step times vary, so faults land at varied moments
  c.eval_every = 40
  c.progress_bar = True  # on a terminal: a bar over the runs
  c.lock()
  return c
