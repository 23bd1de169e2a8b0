r"""In which regime can the papers' claims be tested here? The gap between data-parallel and DiLoCo
M=4 against tokens per parameter, tokens per learner step and the number of outer steps, each
method at its own inner learning rate (best of LRS per cell, the papers' protocol).

  python -m experiments.sweep --config=configs/sweeps/regime.py:part=tune --workdir=runs/regime \
      --parallel=2
  python -m experiments.sweep --config=configs/sweeps/regime.py:part=seeds,winners=runs/regime/results.jsonl \
      --workdir=runs/regime --parallel=2

notebooks/scaling_laws.py ("The regime") reads the table; results are checked in under
notebooks/results/regime/.

The design. One size, the `tiny` byte-level decoder (d 32, 2 layers, 29k parameters), seq 64,
i.i.d. data, M = 4 learners, inner AdamW warmup T/20 then cosine to 0.1x, outer Nesterov (lr 0.4,
momentum 0.9; not tuned). A cell is (T inner steps, b sequences per learner step, H); data-parallel
at a cell trains T steps of 4b sequences (the same tokens; it does not depend on H). Around the
centre (T=480, b=16 (1 KB per learner step), H=24: 20 outer steps, 68 bytes per parameter) one
knob moves at a time:
  * tokens per parameter: T = 120 / 480 / 1,920 with H = T/20 (20 outer steps, 1 KB steps):
    17 / 68 / 271 bytes per parameter;
  * bytes per learner step: b = 4 / 16 / 64 (256 B / 1 KB / 4 KB) at 68 bytes per parameter and
    20 outer steps (T = 1,920 / 480 / 120);
  * outer steps: H = 96 / 24 / 6 at the centre's tokens (5 / 20 / 80 outer steps).
`part=tune` runs every cell at each LRS for both methods (seed 0); `part=seeds` runs seed 1 of the
cells that decide the regime (the tokens-per-parameter and outer-steps axes) at each method's
winning rate, read from the `winners` table (part=tune's results.jsonl). `tiny`: T/8, two rates,
the test suite's version.

Point variants: steps=T, batch=b (per learner), H=h, method=dp|diloco, lr=X, seed=S.
"""

import json

import ml_collections

from configs import shakespeare
from diloco.config import variants

LEARNERS = 4
LRS = (1e-2, 2e-2, 4e-2)
# name -> (T, b, H)
CELLS = {
    "centre": (480, 16, 24),
    "tpp17": (120, 16, 6),
    "tpp271": (1920, 16, 96),
    "step256B": (1920, 4, 96),
    "step4KB": (120, 64, 6),
    "outer5": (480, 16, 96),
    "outer80": (480, 16, 6),
}
DECIDING = ("centre", "tpp17", "tpp271", "outer5", "outer80")
SWEEP_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "outer_steps", "wall_s")


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(
      arg,
      tiny=False,
      part="tune",
      winners="",
      steps=480,
      batch=16,
      H=24,
      method="dp",
      lr=0.0,
      seed=0,
  )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(arg)
  if a.method not in ("dp", "diloco"):
    raise ValueError(f"method must be dp or diloco, got {a.method!r}")
  m = LEARNERS if a.method == "diloco" else 1
  c = shakespeare.get_config(f"mode={a.method},model=tiny,learners={m}")
  c.outer.merge_clock = "arrival"  # these tables' clock (the Decoupled preset's until issue 69)
  c.seed, c.seq_len, c.steps = a.seed, 64, a.steps
  c.batch_size = a.batch * LEARNERS // m  # per learner; dp: the whole global batch on one island
  warmup = max(a.steps // 20, 1)
  c.optimizer.update(dict(warmup_steps=warmup, decay_steps=a.steps - warmup))
  if a.lr:
    c.optimizer.lr = a.lr
  c.data.iid = True
  c.outer.update(dict(inner_steps=a.H, lr=0.4, momentum=0.9))
  c.log_every = max(a.steps // 20, 1)
  c.eval_every = max(a.steps // 4, 1)
  c.checkpoint_every = a.steps  # one checkpoint, at the end
  c.progress_bar = False
  if a.tiny:
    c.data.eval_sequences, c.data.final_eval_sequences = 32, 64
  return c


def point(cell: str, method: str, lr: float, seed: int, tiny: bool = False) -> dict:
  """The sweep point of a cell (data-parallel's has no H: it is the same run at every H)."""
  t, b, h = CELLS[cell]
  if tiny:
    t, h = max(t // 8, 2), max(h // 8, 1)
  out = {"steps": t, "batch": b, "method": method, "lr": lr, "seed": seed}
  return out if method == "dp" else {**out, "H": h}


def winners(rows: list[dict], cell: str, tiny: bool = False) -> dict[str, float]:
  """method -> the rate of LRS with the lowest final eval loss at `cell` (seed 0)."""
  best: dict[str, tuple[float, float]] = {}
  for method in ("dp", "diloco"):
    for lr in _lrs(tiny):
      want = point(cell, method, lr, 0, tiny)
      for r in done_rows(rows, want):
        if method not in best or r["eval_loss"] < best[method][1]:
          best[method] = (lr, r["eval_loss"])
  return {m: lr for m, (lr, _) in best.items()}


def done_rows(rows: list[dict], want: dict, ignore: tuple[str, ...] = ()) -> list[dict]:
  """The finished rows of the point `want` (its keys but `ignore`; rates compared as floats)."""
  same = lambda a, b: a is not None and float(a) == float(b) if isinstance(b, float) else a == b
  keys = [k for k in want if k not in ignore]
  return [
      r for r in rows if r.get("status") == "done" and all(same(r.get(k), want[k]) for k in keys)
  ]


def _lrs(tiny: bool) -> tuple[float, ...]:
  return LRS[:2] if tiny else LRS


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  out = []
  if a.part == "tune":
    for cell in CELLS:
      out += [point(cell, m, lr, 0, a.tiny) for m in ("dp", "diloco") for lr in _lrs(a.tiny)]
  elif a.part == "seeds":
    if not a.winners:
      raise ValueError("part=seeds needs winners=PATH, part=tune's results.jsonl")
    with open(a.winners, encoding="utf-8") as f:
      rows = [json.loads(line) for line in f if line.strip()]
    for cell in DECIDING:
      best = winners(rows, cell, a.tiny)
      out += [point(cell, m, lr, 1, a.tiny) for m, lr in best.items()]
  else:
    raise ValueError(f"unknown part {a.part!r}; known: tune, seeds")
  return list({repr(p): p for p in out}.values())  # a point named twice runs once
