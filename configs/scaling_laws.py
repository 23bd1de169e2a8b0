r"""One run of the DiLoCo scaling-laws study under the paper's protocol (Charles et al. 2025,
arXiv 2503.09799, Section 3 and Appendix), at the sizes 2 CPU cores afford.

  python -m experiments.train --config=configs/scaling_laws.py:size=s,method=diloco,learners=4,lr=0.02,batch=16 \
      --workdir=runs/one
  (about 40 s on 2 cores; the final eval loss of a tuned M=4 cell of size s is about 1.6 nats per
  byte, notebooks/scaling_laws.py has the measured table)

The sweeps that tune and run it, one per stage: configs/sweeps/scaling_inner.py (inner learning
rate x global batch per size and method), scaling_outer.py (outer learning rate per size and M),
scaling_seeds.py (three seeds of every winning cell) and scaling_overtrain.py (4x the tokens,
winners not re-tuned).

The protocol, as the paper's:
  * D = 20 N training bytes for every size (`overtrain=4`: 80 N); a byte is our token;
  * the same global batch of `batch` sequences of 64 bytes split across the M replicas at the
    sequence level (data-parallel trains it on one island);
  * inner AdamW (beta1 0.9, beta2 0.99), linear warmup over 5% of the steps then cosine to 5% of
    the peak, independent weight decay lambda = 1/T, gradient clip 1, QK-norm and z-loss 1e-4
    (recipe=charles2025);
  * H = 30; outer Nesterov momentum 0.9 at a constant outer learning rate `outer_lr`;
  * i.i.d. data (every learner samples the whole corpus); every run scored on the whole
    validation split (one evaluation set for every cell).

Sizes (byte-level decoders, heads of 32 dims but xs's 16: heads of 8 run several times slower per
parameter on this CPU; depth and width grown together as in the paper's Table 3; d_ff = 2 d):
  xs: d 16, 1 layer, 1 head   N = 6,736                  D = 134,720 bytes (the smallest size, so
                                                          that the three tuned sizes span 20.8x)
  s: d 32, 2 layers, 1 head   N = 28,960 (with QK-norm)   D = 579,200 bytes
  m: d 64, 3 layers, 2 heads  N = 139,904                 D = 2,798,080 bytes
  l: d 96, 4 layers, 3 heads  N = 394,336                 D = 7,886,720 bytes (1.6 passes over
                                                          the 4.9 MB training split; 6.4 at 4x)
`tiny`: sizes t1/t2 (d 8 and 16, one layer), 32-byte sequences and 12 steps, for the tests.

method=decoupled: Decoupled DiLoCo (the mode's preset: rebase, K = 1 with grace; P = 4
fragments, the preset's 24 exceeding xs's 10 tensors) at H = 30, with the paper's heterogeneity: the second half of the M learners 18% slower
per step, every step with a 10% log-normal jitter (simulated clock); the budget is the same tokens,
whoever trains them (configs/sweeps/scaling_decoupled.py tunes its outer rate).

Variants: size=xs|s|m|l, method=dp|diloco|decoupled, learners=M, lr=X (peak inner), batch=B (global sequences),
outer_lr=X, seed=S, overtrain=1|4, tiny.
"""

import ml_collections

from configs import shakespeare
from diloco.config import variants
from experiments.studies import scaling_protocol as sp

# name -> (d_model, num_layers, num_heads, parameters N with QK-norm: tests/test_scaling_protocol.py)
SIZES = {
    "xs": (16, 1, 1, 6_736),
    "s": (32, 2, 1, 28_960),
    "m": (64, 3, 2, 139_904),
    "l": (96, 4, 3, 394_336),
}
TINY_SIZES = {"t1": (8, 1, 1, 2_728), "t2": (16, 1, 1, 6_736)}
SEQ, TINY_SEQ, TINY_STEPS = 64, 32, 12
H = 30
TOKENS_PER_PARAM = 20
METHODS = ("dp", "diloco", "decoupled")
SLOWER, JITTER, FRAGMENTS = (
    1.18,
    0.1,
    4,
)  # the paper's heterogeneous setting (issue 51's `paper` speeds)


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      size="s",
      method="dp",
      learners=1,
      lr=1e-2,
      batch=16,
      outer_lr=0.6,
      seed=0,
      overtrain=1,
  )


def run_config(arg: str | None, sweep_keys: tuple[str, ...]) -> ml_collections.ConfigDict:
  """get_config of a sweep file: its own variants (`sweep_keys`: which points to run) dropped."""
  return get_config(variants.drop(arg, sweep_keys))


def sizes(tiny: bool) -> dict[str, tuple[int, int, int, int]]:
  return TINY_SIZES if tiny else SIZES


def swept_sizes(named: str, tiny: bool) -> list[str]:
  """A sweep file's `sizes` variant ('s/m', '': every size of the mode), checked."""
  known = sizes(tiny)
  out = named.split("/") if named else list(known)
  bad = [s for s in out if s not in known]
  if bad:
    raise ValueError(f"unknown sizes {bad}; known{' (tiny)' * tiny}: {sorted(known)}")
  return out


def steps(size: str, batch: int, overtrain: int = 1, tiny: bool = False) -> int:
  """Inner steps T of a run: D = 20 N x overtrain bytes over global steps of `batch` x 64 bytes."""
  if tiny:
    return TINY_STEPS * overtrain
  n = SIZES[size][3]
  return max(round(TOKENS_PER_PARAM * overtrain * n / (batch * SEQ)), 1)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(arg)
  table = sizes(a.tiny)
  if a.size not in table:
    raise ValueError(f"unknown size {a.size!r}; known: {sorted(table)}")
  if a.method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {a.method!r}")
  if a.overtrain not in (1, 4):
    raise ValueError(f"overtrain must be 1 or 4, got {a.overtrain}")
  m = 1 if a.method == "dp" else a.learners
  if a.batch % m:
    raise ValueError(f"global batch {a.batch} does not split over {m} learners")
  seq = TINY_SEQ if a.tiny else SEQ
  c = shakespeare.get_config(f"mode={a.method},model=tiny,learners={m},recipe=charles2025")
  d, layers, heads, _ = table[a.size]
  c.model.update(dict(d_model=d, num_layers=layers, num_heads=heads, d_ff=2 * d, max_len=seq))
  t = steps(a.size, a.batch, a.overtrain, a.tiny)
  warmup = max(t // 20, 1)
  c.seed, c.seq_len, c.steps = a.seed, seq, t
  c.batch_size = a.batch // m  # per learner; dp: the whole global batch on one island
  c.optimizer.update(dict(lr=a.lr, warmup_steps=warmup, decay_steps=t - warmup))
  c.data.iid = True
  c.outer.update(dict(inner_steps=min(H, t) if a.tiny else H, lr=a.outer_lr, momentum=0.9))
  if a.method == "decoupled":
    _heterogeneous(c, m)
  c.log_every = max(t // 20, 1)
  c.eval_every = max(t // 4, 1)
  c.checkpoint_every = t  # one checkpoint, at the end
  c.progress_bar = False
  c.timeline = False
  if a.tiny:
    c.outer.inner_steps = 3
    c.data.eval_sequences, c.data.final_eval_sequences = 32, 64
  return c


def _heterogeneous(c: ml_collections.ConfigDict, m: int) -> None:
  """Decoupled DiLoCo at the paper's setting: the second half of the M learners 18% slower, every
  step with a 10% log-normal jitter, on the simulated clock; the Decoupled preset (rebase) but
  H, which stays the protocol's, and P = 4 fragments (xs has 10 tensors, fewer than the preset's
  24; one P for every size), by the arrival clock its column was run under (the preset's until
  issue 69)."""
  c.outer.merge_clock = "arrival"
  c.outer.fragments = FRAGMENTS
  c.sim.speeds = ",".join(["1"] * (m - m // 2) + [f"{SLOWER:g}"] * (m // 2))
  c.sim.step_jitter = JITTER


def stage_rows(a: ml_collections.ConfigDict) -> tuple[list[dict], list[str]]:
  """A later stage's rows (every table in its `results` workdir) and its sizes."""
  if not a.results:
    raise ValueError(
        "needs results=DIR: the sweep workdir whose tables (*.jsonl) hold the stages so far"
    )
  return sp.read_rows(a.results), swept_sizes(a.sizes, a.tiny)


def winner_points(arg: str | None, seeds: tuple[int, ...], overtrain: int) -> list[dict]:
  """The points of every winning cell (data-parallel and each M at each size) at `seeds` and
  `overtrain` x the tokens: stages (c) and (d). `tiny`: dp and M = 2, the first seed."""
  a = variants.parse_arg(arg, tiny=False, sizes="", results="")
  rows, sizes = stage_rows(a)
  methods, seeds = (sp.TINY_METHODS, seeds[:1]) if a.tiny else (sp.METHODS, seeds)
  return [
      sp.winning_point(rows, s, m, seed=seed, overtrain=overtrain, tiny=a.tiny)
      for s in sizes
      for m in methods
      for seed in seeds
  ]
