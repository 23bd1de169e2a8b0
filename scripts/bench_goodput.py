"""Times the goodput simulator at 1.2M chips against drawing the same chip speeds with numpy.

  python scripts/bench_goodput.py --chips=1200000 --days=1 --seeds=10

Times, for `seeds` seeds of one simulated `days` on `chips` chips (calibrated parameters): each
policy on its own (dp, elastic_dp, decoupled M=8; each run draws its own traces), and the whole
calibration table (one trace per seed shared by dp, elastic_dp and decoupled M=2, 4, 8, 16). The
reference is a numpy pass over the same number of random draws that dominate a trace: one float32
normal per chip per seed, reduced to a minimum per unit. Last line: `table_vs_draws=X` (seconds of
the whole table / seconds of the reference draws, same run).
"""

import numpy as np
from absl import app, flags

from configs import goodput as goodput_config
from diloco import timing
from diloco.sim import goodput

_CHIPS = flags.DEFINE_integer("chips", 1_200_000, "Chips.")
_DAYS = flags.DEFINE_float("days", 1.0, "Simulated days.")
_SEEDS = flags.DEFINE_integer("seeds", 10, "Seeds.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (median).")


def main(argv):
  del argv
  config = goodput_config.get_config(
      f"chips={_CHIPS.value},days={_DAYS.value},seeds={_SEEDS.value}"
  )
  cluster = goodput.cluster_from_config(config)
  seeds = range(_SEEDS.value)
  pauses = dict(
      restart_s=config.restart_s,
      checkpoint_interval_s=config.checkpoint_interval_s,
      downscale_s=config.downscale_s,
      upscale_s=config.upscale_s,
  )

  def draws():
    for s in seeds:
      rng = np.random.default_rng(s)
      z = rng.standard_normal(cluster.chips, dtype=np.float32)
      z.reshape(cluster.units, cluster.unit_chips).min(axis=1)

  reference = timing.median_seconds(draws, _REPEATS.value)
  print(
      f"reference: {len(seeds)} x {cluster.chips:,} normal draws + unit minima: "
      f"{reference:.3f} s"
  )
  for name, kw in [("dp", {}), ("elastic_dp", {}), ("decoupled", dict(learners=8))]:
    policy = goodput.make_policy(name, **pauses, **kw)
    seconds = timing.median_seconds(
        lambda p=policy: goodput.simulate(cluster, p, seeds), _REPEATS.value
    )
    print(
        f"{name:<10} M={getattr(policy, 'learners', 1):<2} {len(seeds)} seeds x "
        f"{_DAYS.value:g} day x {cluster.chips:,} chips: {seconds:.3f} s "
        f"({seconds / reference:.2f}x the draws)"
    )
  table = goodput.policies_from_config(config)
  seconds = timing.median_seconds(
      lambda: goodput.simulate_many(cluster, table, seeds), _REPEATS.value
  )
  print(f"calibration table ({len(table)} policies on shared traces): {seconds:.3f} s")
  print(f"table_vs_draws={seconds / reference:.2f}")


if __name__ == "__main__":
  app.run(main)
