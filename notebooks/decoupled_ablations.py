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
# # Decoupled DiLoCo's ablations in the main job's regime, each row at its own outer learning rate
#
# The Decoupled DiLoCo paper (arXiv 2604.21428) backs its design with ablations. The figures that
# secondary sources agree on are text-benchmark average accuracies (higher is better): the merge
# rule (plain average 54.1 / 52.7 at M = 8 / 16, radial-directional averaging 55.4 / 54.5), the
# outer-gradient precision (bf16 55.4, 4-bit 55.3 with +0.09% validation loss, 2-bit 42.6 with +32%,
# 1-bit 37.3 with +83%), the fragmentation (by layer 55.3, by tensor 55.4, balanced tensors 55.4),
# and the number of learners at 1.2M chips (goodput 70 / 82 / 88 / 93% and text average 54.4 / 55.0
# / 55.4 / 53.4 for M = 2 / 4 / 8 / 16).
#
# This notebook runs (or, when its results are checked in, loads) `configs/sweeps/ablations_regime.py`,
# whose docstring has the design: the project's Decoupled preset (M = 8, RDA, the fp4 uplink, P = 4
# balanced fragments, K = 1 with the grace window) with one thing changed, the tiny decoder in the
# README main job's regime (1 KB per learner step, H = 20, 2,000 steps per learner: 100 syncs of
# each fragment), equal learner speeds with a 10% step jitter, the whole validation split. Each
# merge rule and each codec that changes the update's length runs at its own best outer learning
# rate (a doubling ladder extended until every winner is interior); the fragmentations at the
# baseline's. We have no text benchmarks at this scale: our tables compare eval loss (nats per
# byte, lower is better) as relative changes against each table's baseline row, beside the paper's
# relative changes of accuracy.
#
# The first table (`configs/sweeps/ablations.py`, 0.35 bytes per parameter, one outer lr for every
# row) is in BENCHMARKS.md as history; its M, quorum and grace-window rows, which the rerun does
# not repeat, are loaded at the end from `notebooks/results/ablations/`.
#
# Set `DILOCO_NOTEBOOK_TINY=1` for a few-second version (the test suite does);
# `DILOCO_NOTEBOOK_RESULTS_ONLY=1` loads `notebooks/results/ablations_regime/` and never trains
# (`python scripts/render_notebooks.py decoupled_ablations` writes the .ipynb that way).

# %%
import math
import os
import sys
import tempfile

TINY = os.environ.get("DILOCO_NOTEBOOK_TINY") == "1"  # a few-second version of the same sweep
RESULTS_ONLY = os.environ.get("DILOCO_NOTEBOOK_RESULTS_ONLY") == "1"  # load, never train
here = os.getcwd()
REPO = os.path.dirname(here) if os.path.basename(here) == "notebooks" else here
if REPO not in sys.path:  # the config file imports configs.*
  sys.path.insert(0, REPO)

import matplotlib.pyplot as plt

from diloco.sim import calibration, goodput
from experiments.studies import ablation_table as at, outer_lr_search as search, scaling_protocol as sp
from diloco.sweeps import sweep_run

SPEC = os.path.join(REPO, "configs", "sweeps", "ablations_regime.py")
RESULTS = (
    tempfile.mkdtemp() if TINY else os.path.join(REPO, "notebooks", "results", "ablations_regime")
)
FIRST = os.path.join(REPO, "configs", "sweeps", "ablations.py")  # the first table, as history
FIRST_RESULTS = os.path.join(REPO, "notebooks", "results", "ablations")  # loaded, never trained
OPTIONS = dict(parallel=0 if TINY else 2, progress=not TINY)
if TINY:  # which interpreter runs the kernel (the test checks it)
  print(f"python: {sys.executable}; tiny: {TINY}; results: {RESULTS}")
else:
  print(f"results: {os.path.relpath(RESULTS, REPO)}")

# stage(arg, table): one stage of the sweep, run or loaded; False when it has no point
stage = sweep_run.stager(SPEC, RESULTS, RESULTS_ONLY, tiny=TINY, **OPTIONS)


# %% [markdown]
# ## Each tuned row's outer learning rate, seed 0
#
# A doubling ladder from {0.2, 0.4} (0.8 left the grid once every cell run at both rates did better
# at 0.2), extended one rung past any winner on its edge until none is; then the fragmentations at
# the baseline's winner and seeds 1 and 2 of every row (tiny: seed 1).

# %%
search.run_stages(stage, RESULTS, 2 if TINY else 3, between=("fragments",))
rows = sp.read_rows(RESULTS)
grid = search.tuning([r for r in rows if r.get("status") == "done"], at.REGIME_KEYS)
print("eval loss at each outer lr (seed 0); * = winner")
print(search.grid_text(grid, lambda c: "M=%d %s %s %s" % c))

# %% [markdown]
# ## The tables, each row at its own outer learning rate
#
# Mean over the seeds (± half their range); the change against the table's baseline row, and the
# paper's change of text accuracy against its own baseline.

# %%
table = at.regime_cells(rows)
print(f"{len(rows)} runs; seeds per cell: {sorted({len(c.rows) for c in table.values()})}")


def show(title: str, labels: dict, base, paper: dict | None = None, paper_base=None) -> None:
  """One table: label, outer lr, loss ± seed half-range, change vs `base`, each seed, the paper."""
  if not any(c in table for c in labels.values()):
    return
  print(f"\n{title}\n{'':>16}{'outer lr':>9}{'eval loss':>18}{'vs base':>9}  {'seeds':<16}", end="")
  print(f"{'paper':>7}{'vs base':>9}" if paper else "")
  b = table.get(labels[base])
  for label, cell in labels.items():
    c = table.get(cell)
    if c is None:
      continue
    name = f"{label[0]}, M={label[1]}" if isinstance(label, tuple) else label
    d = at.rel(c.loss, b.loss) if b else math.nan
    line = f"{name:>16}{c.outer_lr:>9g}{c.loss:>10.4f} ±{c.spread:.4f}{100 * d:>+8.2f}%  "
    line += f"{' '.join(f'{x:.4f}' for x in c.losses):<16}"
    if paper and label in paper:
      line += f"{paper[label]:>7.1f}{100 * (paper[label] / paper[paper_base] - 1):>+8.2f}%"
    print(line)


for m in (8, 16):
  labels = {k: v for k, v in at.REGIME_MERGE.items() if k[1] == m}
  show(f"merge rule at M={m} (paper: text average)", labels, ("rda", m), at.PAPER_MERGE, ("rda", m))
paper_prec = {"fp32": at.PAPER_PRECISION["bf16"]}  # the paper's full precision is bf16
paper_prec.update({k: at.PAPER_PRECISION[k] for k in ("fp4", "2bit", "1bit")})
show(
    "outer-gradient precision (paper: text average)",
    at.REGIME_PRECISION,
    "fp32",
    paper_prec,
    "fp32",
)
print(
    "paper's validation loss vs bf16: "
    + ", ".join(f"{k} {100 * v:+.2f}%" for k, v in at.PAPER_PRECISION_LOSS.items())
)
paper_frag = {"balanced, P=4": 55.4, "by layer, P=2": 55.3}
show(
    "fragmentation (paper: text average)",
    at.REGIME_FRAGMENTATION,
    "balanced, P=4",
    paper_frag,
    "balanced, P=4",
)

# %%
groups = [("merge", at.REGIME_MERGE), ("precision", at.REGIME_PRECISION)]
groups.append(("fragments", at.REGIME_FRAGMENTATION))
fig, ax = plt.subplots(figsize=(9, 3.6))
names, ys, errs = [], [], []
for group, labels in groups:
  for label, cell in labels.items():
    if cell in table:
      name = f"{label[0]} M={label[1]}" if isinstance(label, tuple) else label
      names.append(f"{name}\n@{table[cell].outer_lr:g}")
      ys.append(table[cell].loss)
      errs.append(table[cell].spread)
ax.bar(range(len(names)), ys, yerr=errs, capsize=3)
ax.set_xticks(range(len(names)), names, fontsize=7)
ax.set_ylim(min(ys) - 0.02, max(ys) + 0.02)
ax.set(
    ylabel="eval loss (nats/byte)",
    title="each row at its own outer lr (error bars: seed half-range)",
)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The published findings on our table
#
# A difference counts when it is larger than the larger seed half-range of the two cells.

# %%
for claim, verdict, numbers in at.regime_findings(table):
  print(f"{verdict.upper()}: {claim}\n    {numbers}")

# %% [markdown]
# ## History: the first table's learners, quorum and grace-window rows
#
# Not rerun, and loaded in every mode (tiny too) from `notebooks/results/ablations/`: the first
# table (0.35 bytes per parameter, outer lr 0.4 for every row), beside the calibrated cluster
# simulator's goodput for M learners of 1.2M chips with a one-year MTBI per chip
# (notebooks/goodput.py). Read the losses with that table's caveats (BENCHMARKS.md).

# %%
first = at.cells(sweep_run.load(f"{FIRST}:part=all,seeds=2", FIRST_RESULTS))
cluster = calibration.calibrated_cluster(days=0.05 if TINY else 1.0)
timing = calibration.calibrated_timing()
ours = at.rows_of(first, at.LEARNER_ROWS)
ms = sorted(ours)
sims = goodput.simulate_many(
    cluster,
    [goodput.make_policy("decoupled", learners=m, **timing) for m in ms],
    range(2 if TINY else 5),
)
good = {m: r.goodput for m, r in zip(ms, sims)}
print(f"{'M':>4}{'goodput':>9}{'paper':>7}{'eval loss':>11}{'vs M=8':>8}{'paper text avg':>16}")
for m in ms:
  pg, pt = at.PAPER_LEARNERS.get(m, (math.nan, math.nan))
  loss, vs8 = at.mean(ours[m]), at.paired(ours[m], ours[8])
  print(f"{m:>4}{100 * good[m]:>8.1f}%{100 * pg:>6.0f}%{loss:>11.4f}{100 * vs8:>+7.2f}%{pt:>16.1f}")
for title, labels, base in (
    ("quorum", at.QUORUM_ROWS, "K=1"),
    ("grace", at.GRACE_ROWS, "grace on"),
):
  got = at.rows_of(first, labels)
  print(
      f"{title}: "
      + ", ".join(
          f"{k} {at.mean(v):.4f} ({100 * at.paired(v, got[base]):+.2f}%)" for k, v in got.items()
      )
  )

fig, ax1 = plt.subplots(figsize=(5.5, 3.5))
ax1.plot(ms, [100 * good[m] for m in ms], "o-", label="goodput (simulator)")
ax1.set(xscale="log", xlabel="learners M", ylabel="goodput at 1.2M chips (%)")
ax1.set_xticks(ms, [str(m) for m in ms])
ax2 = ax1.twinx()
ax2.plot(
    ms, [at.mean(ours[m]) for m in ms], "s--", color="tab:red", label="eval loss (first table)"
)
ax2.set_ylabel("eval loss, equal tokens (nats/byte)")
fig.legend(loc="upper center", ncol=2, fontsize=8)
plt.tight_layout()
plt.show()
