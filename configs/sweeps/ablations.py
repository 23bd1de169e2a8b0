r"""Decoupled DiLoCo's ablations (arXiv 2604.21428) at small scale, as a sweep.

Commands (notebooks/decoupled_ablations.py reads the table; results are checked in under
notebooks/results/ablations/):

  python -m experiments.sweep --config=configs/sweeps/ablations.py:part=all \
      --workdir=runs/ablations --parallel=2
  python -m experiments.sweep --config=configs/sweeps/ablations.py:part=all,seeds=2 \
      --workdir=runs/ablations --parallel=2

Every point is the project's Decoupled preset (quorum K=1, adaptive grace, token weights, RDA with
the embeddings by mean, fp4 log-rounded outer gradients, P=24 balanced fragments each synced every
H=24 steps, overlap 2, staleness damping) with one thing changed. `part` picks the ablations
(slash-separated, or `all`):
  merge          plain (token-weighted) mean vs RDA, at M=8 and M=16
  precision      fp32, bf16, int8, fp4 with log / linear / stochastic rounding, each with and
                 without uplink error feedback, 2-bit, 1-bit
  fragmentation  balanced (P=24), by layer (strided, P=4: one block each), strided (P=2)
  learners       M = 2, 4, 8, 16 (the notebook sets the goodput simulator's figure beside each)
  quorum         K = 1, 2, M
  grace          the adaptive grace window on (gamma 0.8) and off
  outer_lr       a check added once the first table was in (1-bit and the plain mean, which both
                 shorten the merged update, beat RDA and fp32): outer lr 0.25 (= 0.4 x 2/pi, the
                 factor 1-bit shortens a Gaussian by) with RDA, the mean, and fp32
`seeds=2` adds a second seed of the cells that decide a published finding (see `deciding`); `tiny`
shrinks the runs (tiny model, 12 steps of 16 sequences of 32 bytes, P <= 4) for the test suite, and
keeps only the cells at M = 8 and 16 (`TINY_LEARNERS`: each M compiles its own stacked step, ~10 s
on a CPU, and the merge table needs these two).

The design, and why (2 CPU cores, about an hour for the whole table):
  * the `small` decoder (0.89M parameters), bytes, sequences of 64;
  * equal tokens: 300 inner steps of a global batch of 16 sequences, split over the M learners
    (M=16: one sequence each), 307,200 bytes per run;
  * inner AdamW lr 5e-3 (the README comparison's), 20 warmup steps, cosine to 0.1x; outer Nesterov
    lr 0.4, momentum 0.9; i.i.d. data; equal learner speeds with a 10% log-normal step jitter, so
    that uploads of one round do not arrive at one instant;
  * evaluation on the first 1,024 validation sequences (the same bytes for every M).

Point variants (set by get_sweep; usable alone with experiments.train): learners=M, merge=mean|rda,
codec=..., rounding=log|linear|stochastic, ef=0|1, frag=balanced|layer|strided, quorum=K (0: M),
grace=0|1, outer_lr=X, seed=S.
"""

import ml_collections

from configs import shakespeare
from diloco.config import variants

SWEEP_KEYS = ("eval_loss", "eval_bpb", "merges", "mean_quorum", "mean_staleness", "bytes_sent")
PARTS = ("merge", "precision", "fragmentation", "learners", "quorum", "grace", "outer_lr")
EVAL_SEQS = 1024
# The defaults of every variant: the Decoupled preset at M=8.
BASE = dict(learners=8, merge="rda", codec="fp4", rounding="log", ef=0, frag="balanced")
BASE.update(quorum=1, grace=1, outer_lr=0.4)
FRAGS = {"balanced": ("balanced", 24), "layer": ("strided", 4), "strided": ("strided", 2)}
# budget=regime (configs/sweeps/ablations_regime.py): the tiny decoder has 14 tensors in 2 blocks.
REGIME_FRAGS = {"balanced": ("balanced", 4), "layer": ("strided", 2), "fine": ("balanced", 8)}
TINY_LEARNERS = (8, 16)  # the merge table's; tiny skips the cells at any other M


def _arg(arg: str | None) -> ml_collections.ConfigDict:
  return variants.parse_arg(arg, tiny=False, part="all", seeds=1, seed=0, budget="small300", **BASE)


def _budget(tiny: bool, budget: str) -> dict:
  """small300: this file's table (a global batch split over M); regime: the README main job's
  regime for every learner (16 sequences of 64 bytes per learner step, H = 20, 2,000 steps: 100
  syncs of each fragment), the tiny decoder at its tuned Decoupled rate 1e-2."""
  if budget not in ("small300", "regime"):
    raise ValueError(f"budget={budget!r}: expected small300 or regime")
  if tiny:
    return dict(model="tiny", batch=16, seq=32, steps=12, inner_steps=6, fragments=4, warmup=2)
  if budget == "regime":
    return dict(model="tiny", per_learner=16, seq=64, steps=2000, inner_steps=20, warmup=100)
  return dict(model="small", batch=16, seq=64, steps=300, inner_steps=24, fragments=24, warmup=20)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = _arg(arg)
  b = _budget(a.tiny, a.budget)
  regime = a.budget == "regime" and not a.tiny
  frags = REGIME_FRAGS if regime else FRAGS
  if a.frag not in frags:
    raise ValueError(f"frag={a.frag!r}: expected one of {sorted(frags)}")
  if regime:
    per, lr = b["per_learner"], 1e-2
  else:
    if b["batch"] % a.learners:
      raise ValueError(f"the global batch {b['batch']} does not split over {a.learners} learners")
    per, lr = b["batch"] // a.learners, 5e-3
  c = shakespeare.get_config(f"mode=decoupled,model={b['model']},learners={a.learners}")
  c.outer.merge_clock = "arrival"  # these tables' clock (the Decoupled preset's until issue 69)
  c.seed, c.seq_len, c.steps, c.batch_size = a.seed, b["seq"], b["steps"], per
  c.model.max_len = b["seq"]
  c.optimizer.update(dict(lr=lr, warmup_steps=b["warmup"], decay_steps=b["steps"] - b["warmup"]))
  c.data.iid = True
  c.data.eval_sequences = 32 if a.tiny else (0 if regime else EVAL_SEQS)
  c.data.final_eval_sequences = 64 if a.tiny else 0  # 0: the whole validation split
  kind, p = frags[a.frag]
  if a.tiny:
    p = min(p, b["fragments"], 2 if kind == "strided" else b["fragments"])
  c.outer.update(dict(inner_steps=b["inner_steps"], fragments=p, fragment_kind=kind))
  c.outer.update(dict(merge=a.merge, codec=a.codec, fp4_rounding=a.rounding))
  c.outer.update(dict(error_feedback=bool(a.ef), quorum=a.quorum or a.learners))
  c.outer.update(dict(lr=a.outer_lr, momentum=0.9, grace_gamma=0.8 if a.grace else 0.0))
  c.outer.delivery = "replace"  # the rule these tables were measured under
  c.sim.step_jitter = 0.1
  c.log_every = max(b["steps"] // 30, 1)
  c.eval_every = b["steps"]
  c.checkpoint_every = b["steps"]
  c.timeline = False
  return c


def point(seed: int = 0, **changes) -> dict:
  """A point: the variants that differ from BASE (in BASE's order), then the seed."""
  for k in changes:
    if k not in BASE:
      raise ValueError(f"unknown ablation variant {k!r}; known: {sorted(BASE)}")
  out = {k: changes[k] for k in BASE if k in changes and changes[k] != BASE[k]}
  return {**out, "seed": seed}


def cells(part: str) -> list[dict]:
  """The changes (from BASE) of one ablation."""
  if part == "merge":
    return [dict(learners=m, merge=r) for m in (8, 16) for r in ("mean", "rda")]
  if part == "precision":
    out = [dict(codec=c) for c in ("fp32", "bf16", "int8")]
    out += [dict(rounding=r, ef=e) for r in ("log", "linear", "stochastic") for e in (0, 1)]
    return out + [dict(codec="2bit"), dict(codec="1bit")]
  if part == "fragmentation":
    return [dict(frag=f) for f in FRAGS]
  if part == "learners":
    return [dict(learners=m) for m in (2, 4, 8, 16)]
  if part == "quorum":
    return [dict(quorum=k) for k in (1, 2, 0)]
  if part == "grace":
    return [dict(grace=g) for g in (1, 0)]
  if part == "outer_lr":  # a check, added after the first table: 0.4 x 2/pi (1-bit's shrink)
    return [dict(outer_lr=0.25, merge=r) for r in ("rda", "mean")] + [
        dict(outer_lr=0.25, codec="fp32")
    ]
  raise ValueError(f"unknown part {part!r}; known: {PARTS} or all")


def deciding(changes: dict) -> bool:
  """Whether a cell decides a published finding (it gets the second seed): the merge rule, full
  precision against fp4 (every rounding: they decide the default), 2- and 1-bit, fragmentation."""
  keys = set(changes) - {"learners", "outer_lr"}
  if not keys or keys == {"merge"}:
    return True
  if keys & {"rounding", "ef", "frag"}:
    return True
  return changes.get("codec") in ("fp32", "2bit", "1bit")


def get_sweep(arg: str | None = None) -> list[dict]:
  a = _arg(arg)
  parts = PARTS if a.part == "all" else tuple(a.part.split("/"))
  out = []
  for part in parts:
    for ch in cells(part):
      if a.tiny and ch.get("learners", BASE["learners"]) not in TINY_LEARNERS:
        continue
      out.append(point(0, **ch))
      if a.seeds > 1 and deciding(ch):
        out += [point(s, **ch) for s in range(1, a.seeds)]
  return list({repr(p): p for p in out}.values())  # the baseline is in every part: it runs once
