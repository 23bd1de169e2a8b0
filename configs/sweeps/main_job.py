r"""The inner learning rate of each method of the README's main job, tuned on a small grid.

  python -m experiments.sweep --config=configs/sweeps/main_job.py --workdir=runs/main_job \
      --parallel=2

Each point is one run of `mode=compare` exactly as the main job runs it (`resolve.compare_runs`:
the same budget, model, data, seed and presets), alone, at one peak inner learning rate from LRS.
The winner of each method (lowest final eval loss, scored on the whole validation split) is
`compare.inner_lrs` in configs/shakespeare.py; results and the table are checked in under
notebooks/results/main_job/. The main job itself never tunes (the papers' protocol: each method
at its own best, chosen before the reported run). `tiny`: the same sweep on `runlocal`.

Point variants: method=dp|diloco|decoupled, lr=X (0: optimizer.lr), seed=S; `methods=decoupled`
(comma-separated) sweeps only those methods.
"""

import ml_collections

from configs import shakespeare
from diloco.config import checks, resolve, variants

METHODS = ("dp", "diloco", "decoupled")
LRS = (5e-3, 1e-2, 2e-2, 4e-2)
SWEEP_KEYS = ("eval_loss", "eval_bpb", "tokens", "params", "sim_time_s", "wall_s")


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, method="dp", lr=0.0, seed=0, methods="")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(arg)
  if a.method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {a.method!r}")
  c = shakespeare.get_config("mode=compare" + ",runlocal" * a.tiny)
  c.compare.modes, c.seed, c.progress_bar = a.method, a.seed, False
  c.compare.inner_lrs = f"{a.method}={a.lr}" if a.lr else ""
  return resolve.compare_runs(checks.prepare(c))[a.method]


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  lrs = LRS[1:3] if a.tiny else LRS
  methods = a.methods.split(",") if a.methods else METHODS
  return [{"method": m, "lr": lr} for m in methods for lr in lrs]
