# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The regime: where the papers' claims can be tested on 2 CPU cores
#
# The DiLoCo papers compare methods after at least 20 tokens per parameter (Charles et al. 2025,
# arXiv 2503.09799: D = 20N; DiLoCo, Douillard et al. 2023: about 300), hundreds of outer steps,
# thousands of tokens per learner step, and each method at its own tuned inner learning rate. Our
# earlier runs were far from that: the README's main job trained 0.89M parameters on 0.7 bytes per
# parameter with 15 outer steps; the ablation and async sweeps gave 0.35 bytes per parameter; the
# scaling sweep gave M = 8 learners steps of 256 bytes and one learning rate for every method.
#
# This notebook reads two sweeps, both checked in under `notebooks/results/`:
#
# * `configs/sweeps/regime.py`: the gap between data-parallel and DiLoCo M = 4 as one knob moves
#   from a centre (tokens per parameter, bytes per learner step, outer steps), each method at the
#   best inner learning rate of a 3-point grid, two seeds for the cells that decide the regime;
# * `configs/sweeps/main_job.py`: the inner learning rate of each method of the README's main job,
#   tuned on a 4-point grid before the reported run.
#
# Every run is scored on the same bytes (the whole validation split; `data.final_eval_sha256` is
# checked across each table). Outputs are stored by `python scripts/render_notebooks.py regime`,
# which loads the results (`DILOCO_NOTEBOOK_RESULTS_ONLY=1`: nothing is trained); without it, the
# missing points are trained (tens of minutes on 2 cores).

# %%
import math
import os
import sys

here = os.getcwd()
REPO = os.path.dirname(here) if os.path.basename(here) == "notebooks" else here
if REPO not in sys.path:  # the sweep files import configs.shakespeare
  sys.path.insert(0, REPO)

import matplotlib.pyplot as plt

from configs.sweeps import main_job, regime
from diloco.sweeps import eval_sets, sweep_run

RESULTS_ONLY = os.environ.get("DILOCO_NOTEBOOK_RESULTS_ONLY") == "1"
RESULTS = os.path.join(REPO, "notebooks", "results")
SWEEPS = os.path.join(REPO, "configs", "sweeps")


def rows_of(spec: str, workdir: str) -> list[dict]:
  """The sweep's rows (`sweep_run.load_or_run`), all scored on one evaluation set."""
  return eval_sets.same(sweep_run.load_or_run(spec, workdir, RESULTS_ONLY, parallel=2))


print(f"results: {os.path.relpath(RESULTS, REPO)}")

# %% [markdown]
# ## The gap between data-parallel and DiLoCo M = 4, one knob at a time

# %%
tune = rows_of(f"{SWEEPS}/regime.py:part=tune", f"{RESULTS}/regime")
winners_path = os.path.join(RESULTS, "regime", "results_tune.jsonl")
seeds = rows_of(f"{SWEEPS}/regime.py:part=seeds,winners={winners_path}", f"{RESULTS}/regime")
rows = eval_sets.same(tune + seeds, "regime table")
PARAMS = next(r["params"] for r in rows if r["status"] == "done")


def losses(cell: str, method: str, lr: float) -> list[float]:
  """The final eval losses (nats per byte) of a cell's method at `lr`, by seed."""
  found = regime.done_rows(rows, regime.point(cell, method, lr, 0), ignore=("seed",))
  out = {int(r["seed"]): float(r["eval_loss"]) for r in found}
  return [out[s] for s in sorted(out)]


def mean(xs):
  return sum(xs) / len(xs)


table = {}
for cell, (t, b, h) in regime.CELLS.items():
  best = regime.winners(tune, cell)
  dp, dl = losses(cell, "dp", best["dp"]), losses(cell, "diloco", best["diloco"])
  table[cell] = dict(
      T=t,
      b=b,
      H=h,
      outer=t // h,
      bpp=regime.LEARNERS * b * 64 * t / PARAMS,
      step=b * 64,
      dp_lr=best["dp"],
      dl_lr=best["diloco"],
      dp=dp,
      dl=dl,
      gap=mean(dl) / mean(dp) - 1,
      gaps=[a / c - 1 for a, c in zip(dl, dp)],
  )


def edge(lr: float) -> str:
  """The rate, marked ^ when it is at an end of the grid (the optimum may lie beyond it)."""
  return f"{lr:g}{'^' if lr in (min(regime.LRS), max(regime.LRS)) else ''}"


print(f"{PARAMS:,} parameters, M = {regime.LEARNERS}; loss: nats/byte, whole validation split")
print("^: the best rate is at an end of the grid")
head = (
    f"{'cell':>9} {'T':>5} {'b':>3} {'H':>3} {'outer':>5} {'B/param':>8} {'B/step':>6}"
    f" {'DP lr':>6} {'DP loss':>8} {'DiLoCo lr':>9} {'DiLoCo':>8} {'gap':>7} {'seeds':>5}"
)
print(head)
for cell, r in table.items():
  print(
      f"{cell:>9} {r['T']:>5} {r['b']:>3} {r['H']:>3} {r['outer']:>5} {r['bpp']:>8.0f}"
      f" {r['step']:>6} {edge(r['dp_lr']):>6} {mean(r['dp']):>8.4f} {edge(r['dl_lr']):>9}"
      f" {mean(r['dl']):>8.4f} {100 * r['gap']:>+6.2f}% {len(r['dl']):>5}"
  )
two = {c: r for c, r in table.items() if len(r["gaps"]) > 1}
print(
    "gap by seed (deciding cells): "
    + "; ".join(f"{c}: " + ", ".join(f"{100 * g:+.2f}%" for g in r["gaps"]) for c, r in two.items())
)

# %%
AXES = (
    ("bytes per parameter", "bpp", ("tpp17", "centre", "tpp271")),
    ("bytes per learner step", "step", ("step256B", "centre", "step4KB")),
    ("outer steps", "outer", ("outer5", "centre", "outer80")),
)
fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), sharey=True)
for ax, (label, key, cells) in zip(axes, AXES):
  xs = [table[c][key] for c in cells]
  ax.plot(xs, [100 * table[c]["gap"] for c in cells], "o-")
  for c in cells:
    for g in table[c]["gaps"]:
      ax.plot(table[c][key], 100 * g, "k.", ms=4)
  ax.axhline(0, color="grey", lw=0.8)
  ax.set(xscale="log", xlabel=label)
  ax.minorticks_off()
  ax.set_xticks(xs, [f"{x:.0f}" for x in xs])
axes[0].set(ylabel="DiLoCo M=4 vs data-parallel (%)")
fig.suptitle("the gap, each method at its own tuned inner lr (dots: seeds)")
plt.tight_layout()
plt.show()

# %%
# Bytes per parameter of the earlier runs (their configs; the scaling sweep: largest to smallest).
old = {
    "README main job before (0.89M params, 614,400 bytes)": "0.69",
    "ablation and async sweeps before": "0.35",
    "scaling sweep (one inner lr; M = 8 steps of 256 bytes)": "34 to 345",
}
print("regime: DiLoCo M=4 vs data-parallel, gap at the cells that decide it (mean of 2 seeds)")
for cell in regime.DECIDING:
  r = table[cell]
  print(
      f"  {cell:>7}: {r['bpp']:>4.0f} bytes/param, {r['outer']:>3} outer steps, "
      f"{r['step']:>5} bytes/learner step: {100 * r['gap']:+.2f}%"
  )
print("earlier runs: " + "; ".join(f"{k}: {v} bytes/param" for k, v in old.items()))

# %% [markdown]
# **The regime.** With M = 4 and each method at its own best rate of the grid, DiLoCo's gap to
# data-parallel falls with tokens per parameter: +10.3% at 17 bytes per parameter, +8.4% at 68 and
# +3.9% at 273 (20 outer steps each; the two seeds of each agree within 0.7 points). At a fixed
# budget the number of outer steps matters most: +18.9% with 5, +8.4% with 20 and +11.9% with 80
# (outer Nesterov at lr 0.4 for every H, not tuned per H, which the papers do). Bytes per learner
# step at a fixed budget did not help: +7.2% at 256 bytes, +8.4% at 1 KB, +12.6% at 4 KB (fewer,
# larger steps). So the papers' claim, a gap of a few percent at M = 4, can be tested on this
# hardware from a few hundred bytes per parameter and tens of outer steps; that is where the
# README's main job now runs (142 bytes per parameter, 100 outer steps, M = 2 on separate plays:
# DiLoCo 0.2% below data-parallel). The earlier runs were two to three orders of magnitude below
# it in bytes per parameter (the old main job 0.69, the ablation and async sweeps 0.35), below
# this table's smallest budget (17 bytes per parameter, +10.3%); the scaling sweep (34 to 345
# bytes per parameter, 100 outer steps) was inside it, but gave M = 8 learners steps of 256 bytes
# and one inner rate.
# Caveats: one size; at 273 bytes per parameter both methods' best rate is the lowest of the grid
# (their optimum may lie lower), and at 4 KB steps DiLoCo's is the highest.

# %% [markdown]
# ## The main job's inner learning rates, tuned per method

# %%
jobs = rows_of(f"{SWEEPS}/main_job.py", f"{RESULTS}/main_job")
by = {(r["method"], float(r["lr"])): r["eval_bpb"] for r in jobs if r["status"] == "done"}
best_lr = {m: min(main_job.LRS, key=lambda lr: by[(m, lr)]) for m in main_job.METHODS}
print("README main job (mode=compare): final eval bits per byte by peak inner lr; * = lowest")
print(f"{'method':>10}" + "".join(f"{lr:>10g}" for lr in main_job.LRS))
for m in main_job.METHODS:
  marks = ["*" if lr == best_lr[m] else " " for lr in main_job.LRS]
  print(f"{m:>10}" + "".join(f"{by[(m, lr)]:>9.4f}{s}" for lr, s in zip(main_job.LRS, marks)))
print("compare.inner_lrs=" + ",".join(f"{m}={best_lr[m]:g}" for m in main_job.METHODS))
