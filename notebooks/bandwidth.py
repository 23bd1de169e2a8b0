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
# # Cross-datacenter bandwidth per training method
#
# How much bandwidth between datacenters does each method need to keep the chips busy? The model in
# `diloco/sim/bandwidth.py` (the same code as `experiments/bandwidth.py`) lays out one learner's
# steps layer by layer (forward, then backward) and puts each sync on a FIFO link as soon as the
# layer's backward is done; a late sync stalls the forward that needs it. Payload sizes come from
# the codecs in `diloco/outer/codecs/compression.py`. Set `DILOCO_NOTEBOOK_TINY=1` to run it in a few seconds
# (the test suite does); the figures quoted in the text come from the full run, whose outputs
# `python scripts/render_notebooks.py bandwidth` stores in the .ipynb.

# %%
import dataclasses
import os
import sys

TINY = os.environ.get("DILOCO_NOTEBOOK_TINY") == "1"  # shrinks every sweep for tests
try:
  import diloco  # installed with `pip install -e .`
except ImportError:  # a clone that is not installed: the repository root holds notebooks/
  here = os.getcwd()
  sys.path.insert(0, os.path.dirname(here) if os.path.basename(here) == "notebooks" else here)

import matplotlib.pyplot as plt
import numpy as np

from diloco.sim import bandwidth, bandwidth_reference as ref
from diloco.sim.timeline import required_bandwidth

CURVE_TARGETS = (0.5, 0.9, 0.99) if TINY else tuple(np.round(np.arange(0.3, 0.991, 0.03), 2))
if TINY:  # which interpreter runs the kernel (the test checks it)
  print(f"python: {sys.executable}; tiny: {TINY}")
print(
    f"curves: {len(CURVE_TARGETS)} utilizations, {CURVE_TARGETS[0]:.0%} to {CURVE_TARGETS[-1]:.0%}"
)

# %% [markdown]
# ## Streaming DiLoCo's Table 4, 1B rows
#
# 1B parameters in 24 layers, 0.1 s per step, two workers, H = 100; data-parallel gradients and
# DiLoCo's outer gradients in bf16; Streaming DiLoCo with 8 fragments of 3 layers, one step of
# overlap and fp4. The published values are points of a log-spaced grid (`np.logspace(-1, 3, 50)`),
# the smallest grid bandwidth that reaches each target, so we give our continuous answer, the same
# answer snapped up to the grid, and how many grid steps it lands from the published point.

# %%
rows = ref.table4_rows()
print(ref.format_table4(rows))

# %% [markdown]
# Every cell but two of the 50-95% columns lands one grid step above the published one. A payload
# about 15% smaller would explain it: with 0.85e9 values instead of 1e9, 14 of the 15 cells land on
# the published grid point. We do not adopt it (that would be fitting the table); it only says how
# far apart the two models are.

# %%
smaller = ref.table4_rows(dataclasses.replace(ref.TABLE4_WORKLOAD, model_params=0.85e9))
print("grid steps off with 0.85e9 values:", [r["grid_steps_off"] for r in smaller])

# %% [markdown]
# ## Required bandwidth against utilization (Table 4 setting)


# %% tags=["slow"]
def curves(work, methods, targets):
  """Gbit/s needed for each target, per method."""
  return {m.name: [required_bandwidth(work, m.plan(work), t) for t in targets] for m in methods}


table4_methods = [bandwidth.make_method(n, **ref.TABLE4_METHODS) for n in bandwidth.METHODS]
needed_1b = curves(ref.TABLE4_WORKLOAD, table4_methods, CURVE_TARGETS)

fig, ax = plt.subplots(figsize=(6.5, 4.5))
for (name, gbps), color in zip(needed_1b.items(), ["C0", "C1", "C2", "C3"]):
  ax.plot(100 * np.array(CURVE_TARGETS), gbps, "-", color=color, label=name)
  if name in ref.TABLE4:
    ax.plot(100 * np.array(ref.TABLE4_TARGETS), ref.TABLE4[name], "*", color=color, markersize=10)
ax.plot([], [], "k*", label="Table 4 (published)")
ax.set_yscale("log")
ax.set_xlabel("compute utilization (%)")
ax.set_ylabel("Gbit/s per datacenter link")
ax.set_title("1B parameters, 0.1 s/step, 2 workers, H=100")
ax.legend()
ax.grid(alpha=0.3, which="both")
plt.show()

# %% [markdown]
# ## The blog's 198 and 0.84 Gbit/s
#
# The Decoupled DiLoCo blog says data-parallel across 8 datacenters needs about 198 Gbit/s and
# Decoupled DiLoCo about 0.84 Gbit/s, without the setting. One plausible setting that gives both: a
# 27B dense model in 46 layers at 5 s per step, 90% utilization; data-parallel gradients in bf16
# over a ring of 8; Decoupled DiLoCo with its default schedule (24 fragments, each every 24 steps, 2
# steps of overlap) and fp4 both ways to a central synchronizer. Both figures scale as parameters
# per second (here 5.4e9), so model size and step time trade one for one.

# %%
blog = ref.blog_comparison(ref.VARIATIONS[::4] if TINY else ref.VARIATIONS)
print(ref.format_blog(blog))

# %% tags=["slow"]
blog_methods = [bandwidth.make_method(n, **ref.BLOG_METHODS) for n in bandwidth.METHODS]
needed_blog = curves(ref.BLOG_WORKLOAD, blog_methods, CURVE_TARGETS)
fig, ax = plt.subplots(figsize=(6.5, 4.5))
for name, gbps in needed_blog.items():
  ax.plot(100 * np.array(CURVE_TARGETS), gbps, "-", label=name)
ax.plot(
    [100 * ref.BLOG_TARGET] * 2,
    list(ref.BLOG.values()),
    "k*",
    markersize=10,
    label="blog (at our 90% setting)",
)
ax.set_yscale("log")
ax.set_xlabel("compute utilization (%)")
ax.set_ylabel("Gbit/s per datacenter link")
ax.set_title("27B parameters, 5 s/step, 8 datacenters")
ax.legend()
ax.grid(alpha=0.3, which="both")
plt.show()

# %% [markdown]
# ## What to take from it
#
# - With one stated set of assumptions the model lands within 22% of every 50-95% cell of Table 4,
#   and at most one grid step above it; data-parallel and DiLoCo run 1-18% high, Streaming DiLoCo
#   9% low to 22% high.
# - The 99% column is set by the last layer's transfer, which nothing overlaps: it depends on the
#   layer count far more than the other columns do.
# - The blog's two figures fix only parameters per second once the schedule is chosen. The
#   sensitivity table shows which assumptions matter: the codec, the number of fragments and whether
#   there is any overlap move Decoupled DiLoCo's figure several-fold, while the number of
#   datacenters moves only data-parallel's (through the ring's 2(M-1)/M).
