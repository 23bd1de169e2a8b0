r"""Goodput of a training job on 1.2M failing chips: data-parallel, elastic, Decoupled DiLoCo.

Command (the published points beside the calibrated model):

  python -m experiments.simulate_goodput --config=configs/goodput.py --workdir=runs/goodput

Variants after the colon, comma-separated (e.g. `configs/goodput.py:policy=decoupled,learners=8`):
  policy=all|dp|elastic_dp|decoupled   all (default): dp, elastic_dp, and decoupled for each M in
                                       learners_sweep.
  chips=N, learners=M, quorum=K, seeds=S, days=D
  tiny            12,000 chips for 6 hours, hosts back after 10 minutes, 3 seeds: a smoke run.

Any key can be overridden on the command line, e.g. `--config.chips=2400000`; unknown keys fail (the
config is locked). `get_sweep()` lists the scales the calibrated model is asked to predict.

Expected (2-core CPU, about 2 s): every published point within 3 goodput points (largest gap 1.5):
dp 27.0 (published 27), elastic_dp 56.5 (58), decoupled M=2 71.3 (70), M=4 82.1 (82), M=8 88.8
(88), M=16 92.7 (93), with 95% CI half-widths of 0.1 to 0.5 points over 10 seeds; see BENCHMARKS.md.
"""

import ml_collections

from diloco.config import variants
from diloco.sim import calibration


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = variants.parse_arg(
      arg,
      policy="all",
      chips=calibration.PUBLISHED_CHIPS,
      learners=8,
      quorum=1,
      seeds=10,
      days=1.0,
      tiny=False,
  )
  c = ml_collections.ConfigDict()
  c.policy = arg.policy  # all | dp | elastic_dp | decoupled
  c.chips = arg.chips
  c.learners = arg.learners  # M, for policy=decoupled
  c.quorum = arg.quorum  # K: the global model advances while at least K learners are up
  c.learners_sweep = (2, 4, 8, 16)  # the M values of policy=all
  c.mtbi_years = calibration.PUBLISHED_MTBI_YEARS  # per chip
  c.days = arg.days
  c.seeds = arg.seeds
  c.seed = 0  # first seed; seeds run seed, seed+1, ...
  for key, value in calibration.CALIBRATED.items():
    c[key] = value  # unit_chips, return_time_s, restart_s, checkpoint_interval_s, ...
  if arg.tiny:
    c.chips, c.days, c.seeds = 12_000, 0.25, 3
    c.return_time_s = 600.0
  c.lock()
  return c


def get_sweep() -> list[dict]:
  """The scales the calibrated model predicts without refitting."""
  return [dict(chips=n) for n in (150_000, 300_000, 600_000, 1_200_000, 2_400_000)]
