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

`part=continued` (with --parallel=1: its first point is the others' start) trains dp to step 200
of the 1000-step schedule and continues it 800 steps as dp and as DiLoCo FedAvg. `part=more` runs the rest of the section "Where the gap comes from" (outer and inner learning
rates, 4000 steps, warm starts from part=probe's run=dp_b32 under `probe_dir`):

  python -m experiments.sweep --config=configs/sweeps/gap_probe.py:part=more,probe_dir=runs/gap_probe \
      --workdir=runs/gap_probe --table=results_more

Point variant: run=NAME, one of RUNS or MORE.
"""

import ml_collections

from configs import shakespeare
from diloco.config import variants

STEPS, BATCH, LR = 1000, 8, 5e-3
SWEEP_KEYS = ("eval_loss", "eval_bpb", "tokens", "params", "outer_steps", "wall_s")
NESTEROV = dict(optimizer="nesterov", lr=0.4, momentum=0.9)
FEDAVG = dict(optimizer="sgd", lr=1.0, momentum=0.0)
# name -> (mode, learners, batch per learner, H, outer step, other changes)
RUNS = {  # part=probe, in the order they run: the rows the findings rest on first
    "dp_b32": ("dp", 1, 4 * BATCH, 0, {}, {}),
    "diloco_m4_h50": ("diloco", 4, BATCH, 50, NESTEROV, {}),
    "fedavg_m4_h1": ("diloco", 4, BATCH, 1, FEDAVG, {}),
    "fedavg_m4_h50": ("diloco", 4, BATCH, 50, FEDAVG, {}),
    "dp_b8": ("dp", 1, BATCH, 0, {}, {}),
    "diloco_m1_h50": ("diloco", 1, BATCH, 50, NESTEROV, {}),
    "fedavg_m4_h10": ("diloco", 4, BATCH, 10, FEDAVG, {}),
    "dp_b32_lr1e-2": ("dp", 1, 4 * BATCH, 0, {}, {"lr": 1e-2}),
    "diloco_m4_h50_iid": ("diloco", 4, BATCH, 50, NESTEROV, {"iid": True}),
}
MORE = {  # part=more: the rest of "Where the gap comes from" (warm starts from run=dp_b32)
    "fedavg_m4_h50_lr2.5e-3": ("diloco", 4, BATCH, 50, FEDAVG, {"lr": 2.5e-3}),
    "fedavg_m4_h50_lr1e-2": ("diloco", 4, BATCH, 50, FEDAVG, {"lr": 1e-2}),
    "diloco_m4_h50_lr1e-2": ("diloco", 4, BATCH, 50, NESTEROV, {"lr": 1e-2}),
    "nesterov0.7m0.5_m4_h50": ("diloco", 4, BATCH, 50, dict(NESTEROV, lr=0.7, momentum=0.5), {}),
    "sgd1.5_m4_h50": ("diloco", 4, BATCH, 50, dict(FEDAVG, lr=1.5), {}),
    "sgd2.0_m4_h50": ("diloco", 4, BATCH, 50, dict(FEDAVG, lr=2.0), {}),
    "warm_dp_b32": ("dp", 1, 4 * BATCH, 0, {}, {"warm": True}),
    "warm_diloco_m4_h50": ("diloco", 4, BATCH, 50, NESTEROV, {"warm": True}),
    "warm_nesterov0.7_m4_h50": ("diloco", 4, BATCH, 50, dict(NESTEROV, lr=0.7), {"warm": True}),
    "warm_fedavg_m4_h50": ("diloco", 4, BATCH, 50, FEDAVG, {"warm": True}),
    "dp_b32_4000": ("dp", 1, 4 * BATCH, 0, {}, {"steps": 4000}),
    "fedavg_m4_h50_4000": ("diloco", 4, BATCH, 50, FEDAVG, {"steps": 4000}),
    "diloco_m4_h50_4000": ("diloco", 4, BATCH, 50, NESTEROV, {"steps": 4000}),
}
CONTINUED = {  # part=continued, in order (the first is the others' start): run with --parallel=1
    "dp_b32_to200": ("dp", 1, 4 * BATCH, 0, {}, {"steps": 200, "decay_steps": STEPS - 20}),
    "cont_dp_b32_800": ("dp", 1, 4 * BATCH, 0, {}, {"continue": True}),
    "cont_fedavg_m4_h50_800": ("diloco", 4, BATCH, 50, FEDAVG, {"continue": True}),
}
# The rest of the 1000-step cosine from step 200 (warmup 20, decay to 0.1x at step 1000): the lr
# at step 200 and the ratio that ends the continuation where the uninterrupted schedule ends.
CONTINUE_LR, CONTINUE_MIN_RATIO = 4.639e-3, 0.1078
PARTS = {"probe": RUNS, "more": MORE, "continued": CONTINUED}


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, part="probe", run="dp_b32", probe_dir="runs/gap_probe")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(arg)
  runs = {**RUNS, **MORE, **CONTINUED}
  if a.run not in runs:
    raise ValueError(f"run must be one of {sorted(runs)}, got {a.run!r}")
  mode, m, batch, h, outer, extra = runs[a.run]
  c = shakespeare.get_config(f"mode={mode},model=small,learners={m}")
  c.outer.merge_clock = "arrival"  # these tables' clock (the Decoupled preset's until issue 69)
  steps = extra.get("steps", STEPS)
  c.seed, c.seq_len, c.steps, c.batch_size = 0, 64, steps, batch
  c.optimizer.lr = extra.get("lr", LR)
  c.data.iid = extra.get("iid", False)
  if extra.get("warm"):  # continue dp's 1000-step model (fresh optimizer and schedule)
    c.init_from = f"{a.probe_dir}/run=dp_b32"
  if "decay_steps" in extra:  # the first 200 steps of the 1000-step schedule
    c.optimizer.decay_steps = extra["decay_steps"]
  if extra.get("continue"):  # from dp's step 200, the schedule continued (fresh optimizer)
    c.init_from, c.steps = f"{a.probe_dir}/run=dp_b32_to200", STEPS - 200
    c.optimizer.update(
        dict(
            warmup_steps=0, decay_steps=STEPS - 200, lr=CONTINUE_LR, min_lr_ratio=CONTINUE_MIN_RATIO
        )
    )
    steps = c.steps
  if mode == "diloco":
    c.outer.inner_steps = h
    c.outer.update(outer)
  c.eval_every, c.log_every = 250, 50
  c.checkpoint_every = steps  # one checkpoint, at the end
  c.progress_bar = False
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  if a.part not in PARTS:
    raise ValueError(f"unknown part {a.part!r}; known: {sorted(PARTS)}")
  return [{"run": name} for name in PARTS[a.part]]
