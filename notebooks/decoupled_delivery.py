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
# # Decoupled DiLoCo: where each learner's work goes, under each delivery rule
#
# With `outer.delivery=replace` (every preset's rule until this study; the Decoupled preset has
# taken `rebase` since, by the table below) every merged fragment replaces the learner's
# copy, so its progress since its own last upload is lost whenever another learner's merge
# arrives first: in issue 32's heterogeneous runs only 15% of the trained learner-steps reached a
# merge at K = 1. Two rules keep that work (`diloco/outer/learner/learner.py`):
#
# - `rebase`: the learner keeps the progress the merge does not hold,
#   θ ← Θ_new + (θ − Θ_held) + [the merge holds its upload u] decode(u);
# - `at_own_sync`: merges are held until the learner's own next sync point, τ steps after its
#   upload once the merge of that upload is back; uploads go against the version it started from.
#
# This notebook runs (or, when its results are checked in, loads) `configs/sweeps/delivery.py`:
# issue 32's heterogeneous table (8 learners, the Decoupled preset, P = 4, H = 20) at the paper's
# setting (4 learners 18% slower, 10% step jitter), each (domain, policy, rule) at its own outer
# learning rate, three seeds, at equal tokens and at equal simulated time. The paper's rows (text
# and vision benchmark averages, higher is better; from secondary descriptions):
#
# | synchronizer | goodput | text | vision |
# |---|---|---|---|
# | waiting for all, K = 8 | 84% | 54.4 | 37.6 |
# | K = 1 | 100% | 51.4 | 25.7 |
# | K = 1 with the grace window | 100% | 55.3 | 37.0 |
#
# Set `DILOCO_NOTEBOOK_TINY=1` for a few-second version (the test suite does);
# `DILOCO_NOTEBOOK_RESULTS_ONLY=1` loads `notebooks/results/delivery/` and never trains
# (`python scripts/render_notebooks.py decoupled_delivery` writes the .ipynb that way).

# %%
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

from configs.sweeps import delivery as dv, heterogeneous as het
from experiments.studies import delivery_table as dt, outer_lr_search as search, scaling_protocol as sp
from diloco.sweeps import sweep_run

SPEC = os.path.join(REPO, "configs", "sweeps", "delivery.py")
RESULTS = tempfile.mkdtemp() if TINY else os.path.join(REPO, "notebooks", "results", "delivery")
OPTIONS = dict(parallel=0 if TINY else 2, progress=not TINY)
if TINY:  # which interpreter runs the kernel (the test checks it)
  print(f"python: {sys.executable}; tiny: {TINY}; results: {RESULTS}")
else:
  print(f"results: {os.path.relpath(RESULTS, REPO)}")

# stage(arg, table): one stage of the sweep, run or loaded; False when it has no point
stage = sweep_run.stager(SPEC, RESULTS, RESULTS_ONLY, tiny=TINY, **OPTIONS)

# %% [markdown]
# ## The outer learning rate of each cell, seed 0, equal tokens
#
# A doubling ladder, extended past any winner on its edge until none is.

# %%
if not RESULTS_ONLY:  # (loaded: every finished row checked in, whichever stages they are from)
  tune = [
      (f"part=tune,domains={d}", f"tune_{d}") for d in (("text",) if TINY else ("text", "vision"))
  ]
  search.run_stages(stage, RESULTS, 2 if TINY else 3, tune=tune, after=("time",))
everything = sp.read_rows(RESULTS)
rows = [r for r in everything if not r.get("merge")]  # point 3's (point 4's below have `merge`)
tokens = [r for r in rows if dt.budget_of(r) == "tokens"]
print("eval loss at each outer lr (seed 0); * = winner")
print(search.grid_text(search.tuning(tokens, dt.KEYS), lambda c: " ".join(f"{x:>11}" for x in c)))

# %% [markdown]
# ## The table: each cell at its own outer learning rate
#
# Mean over the seeds (± half their range); goodput from the simulated clocks; merged share: the
# share of the learners' trained steps whose progress reached a merge; quorum: learners per
# merge. At equal time every run stops starting steps at the simulated time in which the 8
# learners, never waiting, would train the token budget.

# %%
policies = dv.TINY_POLICIES if TINY else het.POLICIES
tables = {b: dt.cells(rows, b) for b in dv.BUDGETS}


def show(budget: str) -> None:
  table = tables[budget]
  print(f"equal {budget}:")
  if not table:
    print("  (not run yet)")
    return
  print(
      f"{'':>32}{'lr':>8}{'seeds':>6}{'goodput':>9}{'quality':>19}{'merged':>8}{'quorum':>7}"
      f"{'tokens':>10}"
  )
  for key in sorted(table, key=lambda k: (k[0], k[1], policies.index(k[2]), k[3])):
    c = table[key]
    v, s, _ = dt.quality(c, key[1])
    q = f"{100 * v:.2f}% (±{100 * s:.2f})" if key[1] == "vision" else f"{v:.4f} (±{s:.4f})"
    print(
        f"{' '.join(key):>32}{c.outer_lr:>8g}{c.seeds:>6}{100 * c.mean('goodput'):>8.1f}%"
        f"{q:>19}{c.mean('merged_share'):>8.2f}{c.mean('mean_quorum'):>7.2f}"
        f"{c.mean('tokens') / 1e6:>9.2f}M"
    )


for budget in dv.BUDGETS:
  show(budget)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
table = tables["tokens"]
for ax, domain in zip(axes, ("text", "vision")):
  for d, marker in zip(dv.DELIVERIES, "osd"):
    got = [table.get(("paper", domain, p, d)) for p in policies]
    if all(c is None for c in got):
      continue
    key = "eval_accuracy" if domain == "vision" else "eval_loss"
    ys = [float("nan") if c is None else c.mean(key) for c in got]
    err = [0.0 if c is None else c.spread(key) for c in got]
    ax.errorbar(range(len(policies)), ys, yerr=err, fmt=marker + "-", capsize=3, label=d)
  ax.set_xticks(range(len(policies)), policies)
  ax.set(title=f"paper setting, {domain}: " + ("accuracy" if domain == "vision" else "eval loss"))
  if ax.lines:
    ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Findings
#
# A difference counts when it is larger than the larger seed half-range of the two cells.

# %%
for budget in dv.BUDGETS:
  for claim, verdict, numbers in dt.findings(tables[budget], policies, dv.DELIVERIES, budget):
    print(f"{verdict.upper()}: {claim}\n    {numbers}")

# %% [markdown]
# What the verdicts rest on: each cell at its own outer learning rate (the keeping rules want far
# smaller ones than `replace` at K = 1: each merge then carries one learner's whole progress), one
# evaluation set, and the seeds each cell has (its seed count is printed beside it; a cell with
# one seed has no spread, so any difference counts there). Vision cells too are at the rate of
# their lowest eval loss; for the ViT the loss kept falling to rates where accuracy had already
# dropped, so its accuracies are at loss-optimal rates. BENCHMARKS.md, "Where each learner's work
# goes", has the commands, which stages had run, the README main job under each rule, and the
# default this table set: `rebase` for the Decoupled preset (better than `replace` at K = 1 with
# and without grace on text, level or better on vision; worse in the README main job's two
# learners).

# %% [markdown]
# ## Radial-directional averaging where it can matter (point 4)
#
# RDA against the plain mean at M = 8 and 16 learners (M = 16: the paper setting's eight speeds
# twice), waiting for all (merges hold every learner) and K = 1 with grace, text, under `rebase`;
# each (M, policy, merge) at its own outer learning rate, three seeds. The (M = 8, rda) cells are
# point 3's rebase cells (the same runs). The K = 1 cells start on rebase's rate scale
# (lr_scale=0.125: point 3's rebase winners were 0.025-0.05).

# %%
if not RESULTS_ONLY:
  rda, wait_all, k1 = "part=rda,delivery=rebase", "policies=wait_all", "policies=k1_grace"
  tune = [(f"{rda},results={RESULTS}", "rda")]
  if not TINY:  # (k1_grace's rebase winners were 0.025-0.05: its ladder starts lower)
    tune = [(f"{rda},{wait_all},results={RESULTS}", "rda_wait_all")]
    tune.append((f"{rda},{k1},lr_scale=0.125,results={RESULTS}", "rda_k1"))
  search.run_stages(
      stage, RESULTS, 2 if TINY else 3, tune=tune, prefix="rda_", extra="delivery=rebase"
  )
rda_rows = dt.rda_rows(sp.read_rows(RESULTS), "rebase")
rda = dt.rda_cells(rda_rows)
if not rda:
  print("(not run yet)")
else:
  print("eval loss at each outer lr (seed 0); * = winner")
  grid = search.tuning(rda_rows, dt.RDA_KEYS)
  print(search.grid_text(grid, lambda c: " ".join(f"{str(x):>9}" for x in c)))
  print(f"{'M policy merge':>24}{'lr':>8}{'seeds':>6}{'eval loss':>19}{'quorum':>8}{'merged':>8}")
  for key in sorted(rda):
    c = rda[key]
    q = f"{c.mean('eval_loss'):.4f} (±{c.spread('eval_loss'):.4f})"
    print(
        f"{' '.join(map(str, key)):>24}{c.outer_lr:>8g}{c.seeds:>6}{q:>19}"
        f"{c.mean('mean_quorum'):>8.2f}{c.mean('merged_share'):>8.2f}"
    )
  for claim, verdict, numbers in dt.rda_findings(rda):
    print(f"{verdict.upper()}: {claim}\n    {numbers}")
