r"""The CPU probe of the DiLoCo gap (BENCHMARKS.md, "A CPU probe of the DiLoCo gap"), re-measured
on one evaluation set.

  python -m experiments.sweep --config=configs/sweeps/gap_probe.py --workdir=runs/gap_probe \
      --parallel=2

Until commit 6e1bcb4 the probe's data-parallel run at batch 32 was scored on the first 512
validation sequences and every run at batch 8 on the first 128, so its gaps mixed the methods'
difference with that of the two sets. This file rebuilds the probe's runs explicitly (the old
`mode=compare,batch=8` no longer means them: the main job moved to the tiny model) and every point
scores the whole validation split at the end. Expected: about 25 minutes for the nine points on 2
cores; results are checked in under notebooks/results/gap_probe/.

The probe: the `small` byte-level decoder (0.89M parameters), seq 64, 1000 inner steps, AdamW
peak lr 5e-3 (warmup 20, cosine to 0.1x), M = 4 learners of 8 sequences on their own plays
(non-i.i.d.) unless a row says otherwise; data-parallel trains one island on the 4x batch (the
same tokens). Outer steps: Nesterov lr 0.4, momentum 0.9 (the default) or FedAvg (outer SGD,
lr 1, no momentum: the plain average of the learners' parameters).

Point variant: run=NAME, one of RUNS.
"""

import ml_collections

from configs import shakespeare
from diloco.config import variants

STEPS, BATCH, LR = 1000, 8, 5e-3
SWEEP_KEYS = ("eval_loss", "eval_bpb", "tokens", "params", "outer_steps", "wall_s")
# name -> (mode, learners, batch per learner, H, outer step, extra overrides)
RUNS = {  # in the order they run: the rows the findings rest on first
    "dp_b32": ("dp", 1, 4 * BATCH, 0, "", {}),
    "diloco_m4_h50": ("diloco", 4, BATCH, 50, "nesterov", {}),
    "fedavg_m4_h1": ("diloco", 4, BATCH, 1, "fedavg", {}),
    "fedavg_m4_h50": ("diloco", 4, BATCH, 50, "fedavg", {}),
    "dp_b8": ("dp", 1, BATCH, 0, "", {}),
    "diloco_m1_h50": ("diloco", 1, BATCH, 50, "nesterov", {}),
    "fedavg_m4_h10": ("diloco", 4, BATCH, 10, "fedavg", {}),
    "dp_b32_lr1e-2": ("dp", 1, 4 * BATCH, 0, "", {"lr": 1e-2}),
    "diloco_m4_h50_iid": ("diloco", 4, BATCH, 50, "nesterov", {"iid": True}),
}


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, run="dp_b32")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(arg)
  if a.run not in RUNS:
    raise ValueError(f"run must be one of {sorted(RUNS)}, got {a.run!r}")
  mode, m, batch, h, outer, extra = RUNS[a.run]
  c = shakespeare.get_config(f"mode={mode},model=small,learners={m}")
  c.seed, c.seq_len, c.steps, c.batch_size = 0, 64, STEPS, batch
  c.optimizer.lr = extra.get("lr", LR)
  c.data.iid = extra.get("iid", False)
  if mode == "diloco":
    c.outer.inner_steps = h
    if outer == "fedavg":
      c.outer.update(dict(optimizer="sgd", lr=1.0, momentum=0.0))
    else:
      c.outer.update(dict(optimizer="nesterov", lr=0.4, momentum=0.9))
  c.eval_every, c.log_every = 250, 50
  c.checkpoint_every = STEPS  # one checkpoint, at the end
  c.progress_bar = False
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  del arg
  return [{"run": name} for name in RUNS]
