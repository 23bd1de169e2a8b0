r"""Language modelling on Shakespeare's plays (byte-level), the project's default job.

Command (the README's main job):

  python -m experiments.train --config=configs/shakespeare.py --workdir=runs/default

Variants after the colon, comma-separated (e.g. `configs/shakespeare.py:model=tiny,runlocal`):
  mode=dp          single island, data-parallel SPMD over every local device (the only mode so far).
  model=tiny|small|base   tiny ~29k params (tests), small ~0.8M (default demo), base ~27M.
  runlocal         shrink everything to a few seconds on a laptop (tiny model, 40 steps).
  steps=N          inner steps; batch=N global batch (sequences); seq=N sequence length.

Any key can also be overridden on the command line, e.g. `--config.optimizer.lr=1e-3`; unknown keys
fail (the config is locked).

Expected (2-core CPU, small model, 300 steps of 32x128 bytes = 1.23M bytes): eval loss about
1.9 nats, about 2.7 bits per byte, in about 2-3 minutes; BENCHMARKS.md has measured figures.
"""

import ml_collections

from diloco import configlib
from diloco.data import default_data_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = configlib.parse_arg(arg, mode="dp", model="small", runlocal=False, steps=0, batch=0,
                            seq=0)
  c = ml_collections.ConfigDict()
  c.mode = arg.mode
  c.seed = 0
  c.model = configlib.model_config(arg.model)
  c.data = default_data_config()

  c.seq_len = 128
  c.batch_size = 32  # global, in sequences
  c.steps = 300
  c.stop_after_steps = 0  # >0: stop this invocation after N steps, as a preemption would

  c.optimizer = ml_collections.ConfigDict(dict(
      name="adamw", lr=1e-2, warmup_steps=20, decay_steps=280, min_lr_ratio=0.1,
      b1=0.9, b2=0.95, weight_decay=0.1, clip_norm=1.0))

  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))  # -1: the remaining devices
  c.distributed = False  # call jax.distributed.initialize() (multi-host jobs)

  c.log_every = 10
  c.eval_every = 200
  c.checkpoint_every = 200
  c.progress_bar = True

  if arg.runlocal:
    c.model = configlib.model_config("tiny" if arg.model == "small" else arg.model)
    c.seq_len, c.batch_size, c.steps = 32, 8, 40
    c.optimizer.warmup_steps, c.optimizer.decay_steps = 5, 35
    c.log_every, c.eval_every, c.checkpoint_every = 5, 20, 20
    c.data.eval_batches = 4
  if arg.steps:
    c.steps = arg.steps
    c.optimizer.decay_steps = max(arg.steps - c.optimizer.warmup_steps, 1)
  c.batch_size = arg.batch or c.batch_size
  c.seq_len = arg.seq or c.seq_len

  c.lock()
  return c
