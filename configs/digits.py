r"""Image classification: a small ViT on scikit-learn's 8x8 handwritten digits (1,797 images).

  python -m experiments.train --config=configs/digits.py --workdir=runs/digits
  python -m experiments.train --config=configs/digits.py:mode=decoupled --workdir=runs/digits_d

Variants after the colon, comma-separated:
  mode=dp|diloco|streaming|decoupled|compare   as in configs/shakespeare.py (M=4 learners;
                   `--config.sim.speeds=1,1,1,3` makes the last one 3x slower in simulated time;
                   compare runs dp, diloco and decoupled on one budget, the last learner 3x slower).
  model=vit_tiny|vit_small|vit_moe   vit_small (default) d=64, 2 blocks, 4 heads, patches of 2x2;
                   vit_tiny d=32 (tests); vit_moe vit_small with 4 experts (top-2) in both blocks.
  patch=N          patch side in pixels (must divide 8); pool=cls|mean.
  iid=False        each learner trains on its own classes only (c % M == learner).
  runlocal         a few seconds: vit_tiny, 40 steps.
  steps=N, batch=N (images per learner), learners=N, chaos=...   as in configs/shakespeare.py.

The data come out of the scikit-learn wheel (diloco/data/images.py), hash-checked; 359 held-out
images are the validation set. A "token" is an image here (seq_len = 1): budgets, tokens/s and
bytes per token count images. summary.json has eval_loss and eval_accuracy.

Expected on 2 CPU cores (BENCHMARKS.md has the figures): mode=dp about 96% held-out accuracy in
under a minute; mode=decoupled with M=4 and one learner 3x slower at least 93%.
"""

import ml_collections

from configs import shakespeare
from diloco.config import variants
from diloco.models import vit

VIT_SIZES = {
    "vit_tiny": dict(d_model=32, num_layers=2, num_heads=2, d_ff=64),
    "vit_small": dict(d_model=64, num_layers=2, num_heads=4, d_ff=128),
    "vit_moe": dict(d_model=64, num_layers=2, num_heads=4, d_ff=128, num_experts=4, expert_d_ff=64),
}


def model_config(size: str, patch: int, pool: str) -> ml_collections.ConfigDict:
  if size not in VIT_SIZES:
    raise ValueError(f"unknown ViT size {size!r}; known: {sorted(VIT_SIZES)}")
  fields = {**variants.model_config("tiny").to_dict(), **VIT_SIZES[size]}
  fields.update(image_size=8, channels=1, patch_size=patch, num_classes=10, pool=pool)
  fields.update(causal=False, vocab_size=10, max_len=1)
  vit.VitConfig(**fields)  # a patch that does not divide the image fails here, naming both
  return ml_collections.ConfigDict(fields)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = variants.parse_arg(
      arg,
      mode="dp",
      model="vit_small",
      runlocal=False,
      steps=0,
      batch=0,
      learners=0,
      chaos="none",
      iid=True,
      patch=2,
      pool="cls",
  )
  shared = [f"mode={a.mode}", f"chaos={a.chaos}"] + (["runlocal"] if a.runlocal else [])
  shared += [f"learners={a.learners}"] if a.learners else []
  c = shakespeare.get_config(",".join(shared))
  with c.unlocked():
    c.model = model_config("vit_tiny" if a.runlocal else a.model, a.patch, a.pool)
    c.data.source, c.data.iid, c.data.eval_batches = "digits", a.iid, 0
    # 1,000 steps of 64 images (44 epochs of the 1,438 training images); BENCHMARKS.md has the
    # settings tried (600 steps of 32: 94.3%; 1,500: 95.5%; lr 1e-2: 91.5%; mean pooling: 95.7%).
    c.seq_len, c.batch_size, c.steps = 1, 64, 1000
    c.optimizer.update(dict(lr=3e-3, warmup_steps=30, decay_steps=970, weight_decay=0.01))
    c.log_every, c.eval_every, c.checkpoint_every = 20, 200, 200
    if c.mode in ("streaming", "decoupled", "compare"):  # a few dozen tensors: 4 fragments
      c.outer.fragments = min(c.outer.fragments, 4)
      c.compare.decoupled_fragments = 4
    if a.runlocal:
      c.steps, c.batch_size = 40, 16
      c.optimizer.warmup_steps, c.optimizer.decay_steps = 5, 35
      c.log_every, c.eval_every = 5, 20
    if a.steps:
      c.steps = a.steps
      c.optimizer.decay_steps = max(a.steps - c.optimizer.warmup_steps, 1)
    c.batch_size = a.batch or c.batch_size
  return c
