r"""DiLoCo scaling laws at small scale (Charles et al. 2025, arXiv 2503.09799, Table 4), as a sweep.

Commands (the notebook notebooks/scaling_laws.py reads the table; results are checked in under
notebooks/results/scaling/):

  python -m experiments.sweep --config=configs/sweeps/scaling.py:part=tune --workdir=runs/scaling
  python -m experiments.sweep --config=configs/sweeps/scaling.py:part=table,lrs=A/B/C/D \
      --workdir=runs/scaling
  python -m experiments.sweep --config=configs/sweeps/scaling.py:part=seeds,lrs=A/B/C/D \
      --workdir=runs/scaling

`part=tune`: data-parallel at every size, and DiLoCo M = 1, 2, 4, 8 at the smallest size with the
outer learning rate from {0.2, 0.4, 0.6, 0.8, 1.0} (the paper's grid). `part=table`: DiLoCo at the
other sizes with the winning outer learning rate per M (lrs=M1/M2/M4/M8, from part=tune).
`part=seeds`: a second seed of every cell. `part=table2`: the DiLoCo paper's Table 2 analogue at
the smallest size (one learner at batch B, DP at 8B, one learner 8x the steps, DiLoCo M=8 at B).
`tiny`: the same sweep shrunk (2 tiny sizes, M = 1, 2, 12 steps; seeds for DP and M=1 only), 14
points that the test suite runs through the notebook in about 50 s on 2 cores.

The design, and why (2 CPU cores, a few hours for the whole table):
  * byte-level decoders of 3 sizes spanning 10x in parameters, depth and width grown together;
  * equal global batch (32 sequences of 64 bytes = 2,048 bytes per step) and equal tokens for
    every method: DiLoCo with M learners gives each 32/M sequences;
  * H = 30 and 3,000 inner steps: 100 outer steps, as the paper's runs have hundreds; tokens per
    parameter are therefore 6.1M bytes / N (about 340 to 34), above the paper's 20;
  * inner AdamW (lr 1e-2, b2 0.95, weight decay 0.1, clip 1) with 150 warmup steps and cosine decay
    to 0.1x, the same for every method and size (not tuned per size, unlike the paper);
  * outer Nesterov with momentum 0.9; i.i.d. data: every learner samples the whole corpus.

Point variants (set by get_sweep; also usable alone with experiments.train): size=NAME, method=dp|
diloco, learners=M, outer_lr=X, seed=S, batch=B (global sequences), steps=T.
"""

import ml_collections

from configs import shakespeare
from diloco.config import variants

# name -> (d_model, num_layers, num_heads, d_ff): heads of 8 dims, SwiGLU of 2x d_model.
SIZES = {
    "d24l2": (24, 2, 3, 48),
    "d40l3": (40, 3, 5, 80),
    "d64l4": (64, 4, 8, 128),
}
TINY_SIZES = {"d8l1": (8, 1, 1, 16), "d16l1": (16, 1, 2, 32)}
LEARNERS = (1, 2, 4, 8)
OUTER_LRS = (0.2, 0.4, 0.6, 0.8, 1.0)
SEEDS = (0, 1)
SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "outer_steps", "sim_time_s", "wall_s")


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      part="tune",
      lrs="",
      size="",
      method="dp",
      learners=1,
      outer_lr=0.6,
      seed=0,
      batch=0,
      steps=0,
  )


def _budget(tiny: bool) -> dict:
  """Global batch (sequences), sequence length, steps and H of the study (or of its tiny mode)."""
  if tiny:
    return dict(batch=16, seq=32, steps=12, inner_steps=3, warmup=2)  # 8 | batch / 2
  return dict(batch=32, seq=64, steps=3000, inner_steps=30, warmup=150)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(arg)
  sizes = TINY_SIZES if a.tiny else SIZES
  size = a.size or next(iter(sizes))
  if size not in sizes:
    raise ValueError(f"unknown size {size!r}; known: {sorted(sizes)}")
  if a.method not in ("dp", "diloco"):
    raise ValueError(f"method must be dp or diloco, got {a.method!r}")
  b = _budget(a.tiny)
  batch, steps = a.batch or b["batch"], a.steps or b["steps"]
  m = a.learners if a.method == "diloco" else 1
  if batch % m:
    raise ValueError(f"global batch {batch} does not split over {m} learners")
  c = shakespeare.get_config(f"mode={a.method},model=tiny,learners={m}")
  c.outer.merge_clock = "arrival"  # these tables' clock (the Decoupled preset's until issue 69)
  d, layers, heads, ff = sizes[size]
  c.model.update(dict(d_model=d, num_layers=layers, num_heads=heads, d_ff=ff, max_len=b["seq"]))
  c.seed, c.seq_len, c.steps = a.seed, b["seq"], steps
  c.batch_size = batch // m  # per learner; dp: the whole global batch on one island
  c.optimizer.update(dict(lr=1e-2, warmup_steps=b["warmup"], decay_steps=steps - b["warmup"]))
  c.data.iid = True
  c.outer.update(dict(inner_steps=b["inner_steps"], lr=a.outer_lr, momentum=0.9))
  c.log_every = max(steps // 30, 1)
  c.eval_every = max(steps // 3, 1)
  c.checkpoint_every = steps  # one checkpoint, at the end
  if a.tiny:
    c.data.eval_sequences, c.data.final_eval_sequences = 32, 64
  return c


def _lrs(a: ml_collections.ConfigDict) -> dict[int, float]:
  if not a.lrs:
    raise ValueError("part=table|seeds|table2 needs lrs=M1/M2/M4/M8 (the winners of part=tune)")
  lrs = [float(x) for x in a.lrs.split("/")]
  if len(lrs) != len(LEARNERS):
    raise ValueError(f"lrs needs {len(LEARNERS)} values (M = {LEARNERS}), got {a.lrs!r}")
  return dict(zip(LEARNERS, lrs))


def _dp(size: str, seed: int) -> dict:
  return {"size": size, "method": "dp", "seed": seed}


def _diloco(size: str, m: int, lr: float, seed: int) -> dict:
  return {"size": size, "method": "diloco", "learners": m, "outer_lr": lr, "seed": seed}


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  sizes = list(TINY_SIZES if a.tiny else SIZES)
  learners, grid = (LEARNERS[:2], OUTER_LRS[1::2]) if a.tiny else (LEARNERS, OUTER_LRS)
  parts = a.part.split("/")
  out = []
  for part in parts:
    if part == "tune":
      out += [_dp(s, 0) for s in sizes]
      out += [_diloco(sizes[0], m, lr, 0) for m in learners for lr in grid]
    elif part == "table":
      lrs = _lrs(a)
      out += [_diloco(s, m, lrs[m], 0) for s in sizes[1:] for m in learners]
    elif part == "seeds":  # the cells of finding 1 first (DP, M=1), then of finding 3 (M=8 ...)
      lrs = _lrs(a)
      out += [_dp(s, 1) for s in sizes]
      for m in sorted(learners, key=lambda m: (m != 1, -m))[: 1 if a.tiny else None]:
        out += [_diloco(s, m, lrs[m], 1) for s in sizes]  # tiny: DP and M=1 only (time)
    elif part == "table2":  # k = 8 (tiny: 2) learners, or k x the batch, or k x the steps
      lrs, b, s, k = _lrs(a), _budget(a.tiny), sizes[0], learners[-1]
      one = {"size": s, "method": "dp", "batch": b["batch"] // k, "seed": 0}
      out += [one, {**one, "steps": k * b["steps"]}, _dp(s, 0), _diloco(s, k, lrs[k], 0)]
    else:
      raise ValueError(f"unknown part {part!r}; known: tune, table, seeds, table2")
  return list({repr(p): p for p in out}.values())  # a point named twice runs once
