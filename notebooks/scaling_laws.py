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
# # DiLoCo scaling laws under the paper's protocol, at the sizes 2 CPU cores afford
#
# Charles et al. 2025 (arXiv 2503.09799, Table 4) compare data-parallel training with DiLoCo of
# M = 1, 2, 4, 8 replicas for models of 35M to 180M parameters. Their findings: (1) M = 1 DiLoCo
# matches or beats data-parallel at every size; (2) the loss grows with M; (3) the relative gap of
# M >= 2 shrinks as N grows; (4) the best outer learning rate grows with M and not with N;
# (5) DiLoCo's best global batch is larger than data-parallel's and grows with M; (6) the trends
# hold when the models are overtrained 4x.
#
# **This study runs their protocol** (configs/scaling_laws.py): D = 20N training tokens (bytes here)
# for every size; the same global batch split across the M replicas at the sequence level; inner
# AdamW (beta2 0.99), warmup then cosine to 5%, weight decay 1/T, clip 1, QK-norm and z-loss
# (recipe=charles2025); H = 30; outer Nesterov momentum 0.9. Tuned as they tuned: stage (a) the
# inner learning rate (a sqrt(2) ladder) x the global batch (powers of 2) for each size and for
# data-parallel and each M apart, grids extended until the winner beats its whole neighbourhood
# (batches of at least M sequences, the least that splits over M learners); stage (b) the outer learning rate from
# {0.2, 0.4, 0.6, 0.8, 1.0} for each (size, M); stage (c) three seeds of every winning cell;
# stage (d) the winners at 4x the tokens, not re-tuned. Every run is scored on the whole
# validation split (one evaluation set for every cell).
#
# **Outside the paper's regime, on purpose and in size only**: byte-level decoders of 6.7k (xs),
# 29k (s) and 140k (m) parameters, 20.8x apart (heads of 32 dims, 16 at xs; the paper's are
# 35M-180M with a 32k vocabulary) trained on Shakespeare, so losses are nats per byte and only the
# relative gaps compare with the paper's. No size repeats the 4.5 MB training split at 1x (m: 2.5
# passes at 4x). At xs the budget is 134,720 bytes: 8 (M=8) to 70 (M=1) outer steps at its
# winning batches, against the paper's hundreds. Size l (394k parameters, 1.75 passes) started
# stage (a) from m's winners and is not finished (five runs of 9-15 min each so far): it is left
# out of the table.
#
# The results are loaded from `notebooks/results/scaling_paper/` (commands in each stage file of
# configs/sweeps/, and in BENCHMARKS.md). Set `DILOCO_NOTEBOOK_TINY=1` for a few-second version of
# every stage (the test suite does); `DILOCO_NOTEBOOK_RESULTS_ONLY=1` makes a missing run an
# error, never trained. The previous table (one token budget and one inner learning rate for every
# size) is superseded; BENCHMARKS.md keeps it as history.

# %%
import math
import os
import sys
import tempfile

TINY = os.environ.get("DILOCO_NOTEBOOK_TINY") == "1"  # a few-second version of every stage
RESULTS_ONLY = os.environ.get("DILOCO_NOTEBOOK_RESULTS_ONLY") == "1"  # load, never train
here = os.getcwd()
REPO = os.path.dirname(here) if os.path.basename(here) == "notebooks" else here
if REPO not in sys.path:  # the config files import configs.*
  sys.path.insert(0, REPO)

import matplotlib.pyplot as plt

from configs import scaling_laws
from configs.sweeps import scaling
from diloco.sweeps import sweep, sweep_run
from experiments.studies import scaling_protocol as sp, scaling_table as st

RESULTS = (
    tempfile.mkdtemp() if TINY else os.path.join(REPO, "notebooks", "results", "scaling_paper")
)
SIZES = list(scaling_laws.sizes(True)) if TINY else ["xs", "s", "m"]  # l: stage (a) not finished
OPTIONS = dict(parallel=0 if TINY else 2, progress=not TINY)
if TINY:  # which interpreter runs the kernel (the test checks it)
  print(f"python: {sys.executable}; tiny: {TINY}; results: {RESULTS}")
else:
  print(f"results: {os.path.relpath(RESULTS, REPO)}; sizes: {SIZES}")


def stage(name: str, arg: str, table: str, sizes: list[str] = SIZES) -> list[str]:
  """Runs or loads one stage's sweep (configs/sweeps/scaling_<name>.py) size by size; the sizes
  whose every point is done (with RESULTS_ONLY, a size not run yet is named and left out)."""
  spec = os.path.join(REPO, "configs", "sweeps", f"scaling_{name}.py")
  done = []
  for s in sizes:
    variants = ",".join(["tiny"] * TINY + [f"sizes={s}", f"results={RESULTS}"] + [arg] * bool(arg))
    try:
      sweep_run.load_or_run(
          f"{spec}:{variants}", RESULTS, RESULTS_ONLY, **OPTIONS, table=f"{table}_{s}"
      )
      done.append(s)
    except sweep.SweepError as e:  # no point to run: a closed grid's extension
      if "non-empty" not in str(e):
        raise
    except (FileNotFoundError, ValueError) as e:  # not run yet, or an earlier stage missing
      if not RESULTS_ONLY:
        raise
      missing = str(e).partition(" for: ")[2]  # FileNotFoundError: the points without a summary
      print(
          f"stage {name} at size {s}: "
          + (f"{len(missing.split(', '))} points not run yet" if missing else str(e))
      )
  return done


def label(m) -> str:
  return "DP" if m == "dp" else f"M={m}"


# %% [markdown]
# ## Stage (a): inner learning rate x global batch, per size and method
#
# At outer learning rate 0.6, seed 0. Round after round, every cell of a winner's 3 x 3
# neighbourhood (rate x sqrt(2) either way, batch x 2 either way, never below M sequences) is run
# until each winner beats all its neighbours.

# %%
grid_done = stage("inner", "part=grid", "inner")
open_ = [] if TINY else grid_done  # tiny: edges not extended (time)
for i in range(1, 10):  # extension rounds: a size leaves once its round has no point to add
  open_ = stage("inner", "part=extend", f"inner_extend{i}", open_)
  if RESULTS_ONLY or not open_:  # (checked-in rows hold every round: one pass reads them all)
    break
rows = sp.read_rows(RESULTS)
methods = list(sp.TINY_METHODS if TINY else sp.METHODS)
closed = lambda s: all(not sp.edge_neighbours(rows, s, m) for m in methods)
SIZES_A = grid_done if TINY else [s for s in grid_done if closed(s)]  # stage (a) finished
params = {r["size"]: r["params"] for r in rows}
for s in [s for s in SIZES if any(sp.inner_cells(rows, s, m) for m in methods)]:
  state = "" if s in SIZES_A else " (stage (a) not finished: left out of what follows)"
  print(f"size {s} (N = {params[s]:,}): eval loss by inner lr x global batch; * = winner{state}")
  for m in methods:
    cells, best = sp.inner_cells(rows, s, m), sp.inner_winner(rows, s, m)
    if not cells:
      continue
    lrs, batches = sorted({k[0] for k in cells}), sorted({k[1] for k in cells})
    edge = sp.edge_neighbours(rows, s, m)
    note = f"open edge: {edge}" if edge else "closed"
    print(f"  {label(m):>4}  batch " + "".join(f"{b:>9}" for b in batches) + f"   [{note}]")
    for lr in lrs:
      line = "".join(
          f"{cells[(lr, b)]:>8.4f}{'*' if (lr, b) == best else ' '}"
          if (lr, b) in cells
          else " " * 9
          for b in batches
      )
      print(f"        {lr:<10g}{line}")
print("\nwinners (inner lr, global batch):")
for m in methods:
  print(f"  {label(m):>4}: " + ", ".join(f"{s} {sp.inner_winner(rows, s, m)}" for s in SIZES_A))

# %% [markdown]
# ## Stage (b): the outer learning rate against M and N
#
# At each (size, M)'s stage-(a) winner, seed 0.

# %%
SIZES_B = stage("outer", "part=grid", "outer", SIZES_A)
rows = sp.read_rows(RESULTS)
learners = [m for m in methods if m != "dp"]
grid = sorted({lr for s in SIZES_B for m in learners for lr in sp.outer_cells(rows, s, m)})
for s in SIZES_B:
  print(f"size {s}: eval loss by outer lr; * = winner")
  print("        " + "".join(f"{lr:>9g}" for lr in grid))
  for m in learners:
    got, best = sp.outer_cells(rows, s, m), sp.outer_winner(rows, s, m)
    cells = "".join(
        f"{got[lr]:>8.4f}{'*' if lr == best else ' '}" if lr in got else " " * 9 for lr in grid
    )
    print(f"  {label(m):>4}  {cells}")
print("\nbest outer lr (rows: M; columns: size)")
print("      " + "".join(f"{s:>6}" for s in SIZES_B))
for m in learners:
  print(f"{label(m):>5} " + "".join(f"{sp.outer_winner(rows, s, m):>6g}" for s in SIZES_B))

# %% [markdown]
# ## Stages (c) and (d): our Table 4 beside the paper's
#
# Each cell is its winning configuration's mean final eval loss over three seeds (the half-range
# of the seeds in parentheses), and its relative gap to data-parallel at the same size.

# %%
SIZES_C = stage("seeds", "", "seeds", SIZES_B[-1:] if TINY else SIZES_B)  # tiny: one size (time)
SIZES_D = stage("overtrain", "", "overtrain", SIZES_C)
rows = sp.read_rows(RESULTS)
table = sp.table(rows, SIZES_C)
over = sp.table(rows, SIZES_D, overtrain=4)
mu = {k: sp.mean(v) for k, v in table.items()}


def show(title, tab, sizes):
  mean_ = {k: sp.mean(v) for k, v in tab.items() if v}
  print(f"{title}\n{'N':>9}" + "".join(f"{label(m):>24}" for m in methods))
  for s in sizes:
    line = f"{params[s]:>9,}"
    for m in methods:
      v, h = mean_[(s, m)], sp.spread(tab[(s, m)])
      g = "" if m == "dp" else f" [{sp.gap(v, mean_[(s, 'dp')]):+.2f}%]"
      line += f"{v:>9.4f} ({h:.4f}){g:>10}" if m != "dp" else f"{v:>14.4f} ({h:.4f})"
    print(line)


show(
    "ours: eval loss (nats/byte), mean of seeds (seed half-range) [relative gap to DP]",
    table,
    SIZES_C,
)
print(f"seeds per cell: {sorted({len(v) for v in table.values()})}")
print(
    f"\npaper (Table 4, C4): eval loss [relative gap to DP]\n{'N':>9}"
    + "".join(f"{label(m):>24}" for m in methods)
)
for n, ref in sp.PAPER_TABLE4.items():
  line = f"{n / 1e6:>8g}M"
  for m in methods:
    g = "" if m == "dp" else f" [{sp.gap(ref[m], ref['dp']):+.2f}%]"
    line += f"{ref[m]:>18.3f}{g:>6}" if m != "dp" else f"{ref[m]:>24.3f}"
  print(line)
print()
show("ours, overtrained 4x (seed 0, winners not re-tuned)", over, SIZES_D)
print(f"\nsizes by stage: (a) {SIZES_A}, (b) {SIZES_B}, (c) {SIZES_C}, (d) {SIZES_D}")

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.8))
xs = [params[s] for s in SIZES_C]
for m in methods:
  ys, err = [mu[(s, m)] for s in SIZES_C], [sp.spread(table[(s, m)]) for s in SIZES_C]
  ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label(m))
ax.set(
    xscale="log",
    xlabel="parameters N",
    ylabel="eval loss (nats/byte)",
    title="loss against N, D = 20N",
)
ax.legend()
plt.show()

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.8))
for m in methods[1:]:
  ax.plot(xs, [sp.gap(mu[(s, m)], mu[(s, "dp")]) for s in SIZES_C], "o-", label=f"ours {label(m)}")
  ref = [sp.gap(r[m], r["dp"]) for r in sp.PAPER_TABLE4.values()]
  color = ax.lines[-1].get_color()
  ax.plot(list(sp.PAPER_TABLE4), ref, "x--", color=color, label=f"paper {label(m)}")
ax.axhline(0, color="grey", lw=0.5)
ax.set(xscale="log", xlabel="parameters N", ylabel="gap to DP (%)", title="relative gap against N")
ax.legend(fontsize=7, ncol=2)
plt.show()

# %% [markdown]
# ## The six findings, on our table

# %%
found = sp.loss_findings(table, SIZES_C)
found += sp.tuning_findings(rows, SIZES_B)[:1] + sp.tuning_findings(rows, SIZES_A)[1:]
again = sp.loss_findings({k: v[:1] for k, v in over.items()}, SIZES_D)
found.append(sp.overtrain_finding(found[:3], again))
for claim, verdict, numbers in found:
  print(f"{verdict.upper()}: {claim}\n    {numbers}")
if not TINY:
  print(
      "\nsize l (394k parameters): stage (a) started at size m's winners (part=transfer), not"
      " finished: see BENCHMARKS.md for the study's status"
  )

# %% [markdown]
# ## Decoupled DiLoCo's column (issue 55)
#
# The Decoupled DiLoCo paper's claim: "Decoupled DiLoCo performs better with scale relative to
# data-parallel training" (2B to 9B dense). Here, under the same protocol and sizes: M = 2, 4, 8
# learners of the Decoupled preset (rebase, K = 1 with the grace window, token weights,
# radial-directional averaging, fp4 uplink) with P = 4 fragments and H = 30, the second half of
# the learners 18% slower per step and every step with a 10% log-normal jitter, on the simulated
# clock; the same token budget (D = 20N, whoever trains it). Each cell reuses DiLoCo M's stage-(a)
# winner (inner lr and global batch, not re-tuned) and tunes its own outer rate on a doubling
# ladder from {0.1, 0.2, 0.4}, extended past an edge; then three seeds at the winner
# (configs/sweeps/scaling_decoupled.py).

# %%
DEC = list(sp.TINY_DECOUPLED if TINY else sp.DECOUPLED)
SIZES_E = stage("decoupled", "part=tune", "decoupled_tune", SIZES_C)
open_ = [] if TINY else SIZES_E  # tiny: one rate, not extended (time)
for i in range(1, 6):
  open_ = stage("decoupled", "part=extend", f"decoupled_extend{i}", open_)
  if RESULTS_ONLY or not open_:
    break
SIZES_E = stage("decoupled", "part=seeds", "decoupled_seeds", SIZES_E)
rows = sp.read_rows(RESULTS)
dec_table = sp.table(rows, SIZES_E)
dmu = {k: sp.mean(v) for k, v in dec_table.items() if v}
for s in SIZES_E:
  print(f"size {s}: Decoupled eval loss by outer lr (seed 0); * = winner")
  for m in DEC:
    got = sp.decoupled_cells(rows, s, m)
    best = min(got, key=got.get)
    print(
        f"  M={sp.learners_of(m)}  "
        + "  ".join(f"{lr:g}: {v:.4f}{'*' * (lr == best)}" for lr, v in sorted(got.items()))
    )
print("\neval loss, mean of seeds (seed half-range) [relative gap to DP]")
print(
    f"{'N':>9}{'DP':>18}"
    + "".join(
        f"{f'DiLoCo M={sp.learners_of(m)}':>28}{f'Decoupled M={sp.learners_of(m)}':>28}"
        for m in DEC
    )
)
for s in SIZES_E:
  dp = dmu[(s, "dp")]
  line = f"{params[s]:>9,}{dp:>10.4f} ({sp.spread(dec_table[(s, 'dp')]):.4f})"
  for m in DEC:
    for k in (sp.learners_of(m), m):
      v = dmu[(s, k)]
      line += f"{v:>10.4f} ({sp.spread(dec_table[(s, k)]):.4f}) [{sp.gap(v, dp):+6.2f}%]"
  print(line)
print(f"seeds per Decoupled cell: {sorted({len(dec_table[(s, m)]) for s in SIZES_E for m in DEC})}")
claim, verdict, numbers = sp.decoupled_finding(dec_table, SIZES_E)
print(f"\n{verdict.upper()}: {claim}\n    {numbers}")

# %% [markdown]
# ## The DiLoCo paper's Table 2, analogue
#
# From the previous study (configs/sweeps/scaling.py: 6.1M bytes, one inner learning rate, the
# 18k-parameter model; not rerun under the new protocol). Douillard et al. 2023 compare: one learner at batch B, data-parallel
# at 8B, one learner with 8x the steps at batch B, and DiLoCo with M = 8 learners at batch B each;
# the last three see the same tokens, the first one eighth of them (their perplexities: 16.23,
# 15.30, 14.72 and 15.02; H = 500 there, 30 here). Our perplexity is per byte, exp(eval loss).


# %%
def table2() -> None:
  """The analogue from the previous study's rows (not run in tiny mode; the staleness test runs
  it on the checked-in rows)."""
  OLD = os.path.join(REPO, "configs", "sweeps", "scaling.py")  # the previous study's sweep
  old_results = os.path.join(REPO, "notebooks", "results", "scaling")

  def old_part(part: str, lrs: str = "") -> list[dict]:
    spec = f"{OLD}:part={part}" + f",lrs={lrs}" * bool(lrs)
    return sweep_run.load_or_run(
        spec, old_results, RESULTS_ONLY, **OPTIONS, table=f"results_{part}"
    )

  best = st.winners(old_part("tune"), list(scaling.SIZES)[0])  # its outer lr tuned per M
  lrs = "/".join(f"{best[m][0]:g}" for m in scaling.LEARNERS)
  t2 = old_part("table2", lrs)
  one = [r for r in t2 if r.get("batch") and not r.get("steps")]
  eight = [r for r in t2 if r.get("batch") and r.get("steps")]
  dp8 = [r for r in t2 if r["method"] == "dp" and not r.get("batch")]
  dil = [r for r in t2 if r["method"] == "diloco"]
  print(f"{'':28}{'tokens':>11}{'loss':>8}{'ppl/byte':>10}{'paper ppl':>11}")
  ours = {}
  for (name, paper), got in zip(st.PAPER_TABLE2.items(), (one, dp8, eight, dil)):
    r = got[0]
    ours[name] = r["eval_loss"]
    print(
        f"{name:28}{r['tokens']:>11,}{r['eval_loss']:>8.4f}{math.exp(r['eval_loss']):>10.4f}{paper:>11.2f}"
    )
  rank = lambda d: sorted(d, key=d.get)
  print(f"order, best first: ours {rank(ours)}\n                   paper {rank(st.PAPER_TABLE2)}")
  print(f"same order as the paper: {rank(ours) == rank(st.PAPER_TABLE2)}")


if TINY:
  print("tiny: the Table 2 analogue is the previous study's; not run in tiny mode")
else:
  table2()
