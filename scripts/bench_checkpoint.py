"""CPU time of a learner's checkpoint save (inner/checkpoint.py) from host copies of its arrays,
against orbax saving the same jax.Arrays, in the same run, on the same devices.

  python scripts/bench_checkpoint.py                       # runlocal (tiny) on 8 CPU devices
  python scripts/bench_checkpoint.py --model=small --devices=1

Each is orbax's CheckpointManager (asynchronous, as Checkpointer has it) saving the island's whole
train state --saves times after two warm-up saves, interleaved --repeats times; the best counts.
CPU time is this process's, every thread of it (orbax writes on threads of its own).
Its last line: `host_vs_jax_cpu=X` (below 1: the host copies cost less).
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

from absl import app, flags, logging

_MODEL = flags.DEFINE_string("model", "tiny", "model.size")
_DEVICES = flags.DEFINE_integer("devices", 8, "CPU devices (set before jax is imported)")
_SAVES = flags.DEFINE_integer("saves", 10, "timed saves per repeat")
_REPEATS = flags.DEFINE_integer("repeats", 3, "interleaved repeats; the best counts")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_DEVICES.value}"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import orbax.checkpoint as ocp

  from configs import shakespeare
  from diloco import data as data_lib
  from diloco.inner import checkpoint, island as island_lib

  config = shakespeare.get_config(f"runlocal,model={_MODEL.value}")
  isl = island_lib.build_island(config, jax.devices(), splits=data_lib.load_splits(config.data))
  state = isl.init_state()
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))

  def cpu_s_per_save(make) -> float:
    manager = ocp.CheckpointManager(
        tempfile.mkdtemp(), options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True)
    )
    save = lambda i: manager.save(
        i, args=ocp.args.Composite(state=ocp.args.StandardSave(make())), force=True
    )
    for i in range(2):
      save(i)
    manager.wait_until_finished()
    start = os.times()
    for i in range(2, 2 + _SAVES.value):
      save(i)
    manager.wait_until_finished()
    end = os.times()
    manager.close()
    return (end.user - start.user + end.system - start.system) / _SAVES.value

  best = {"jax": float("inf"), "host": float("inf")}
  for _ in range(_REPEATS.value):
    best["jax"] = min(best["jax"], cpu_s_per_save(lambda: state))
    best["host"] = min(best["host"], cpu_s_per_save(lambda: checkpoint._on_host(state)))
  print(
      f"model={_MODEL.value} devices={len(jax.devices())} state={nbytes / 2**20:.2f} MiB "
      f"({len(jax.tree.leaves(state))} arrays)"
  )
  for name, s in best.items():
    print(f"  {name:>5}: {s * 1e3:7.1f} ms of CPU a save")
  print(f"host_vs_jax_cpu={best['host'] / best['jax']:.3f}")


if __name__ == "__main__":
  app.run(main)
