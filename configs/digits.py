r"""Image classification: a small ViT on scikit-learn's 8x8 handwritten digits (1,797 images).

  python -m experiments.train --config=configs/digits.py --workdir=runs/digits
  python -m experiments.train --config=configs/digits.py:mode=decoupled --workdir=runs/digits_d

Variants after the colon, comma-separated (each sets a key, as the `--config.` flag would; `python -m
experiments.config --config=configs/digits.py` lists every key):
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
from diloco.config import base, keys, resolve, variants

VARIANTS = {
    **{k: v for k, v in shakespeare.VARIANTS.items() if k != "seq"},
    "iid": "data.iid",
    "patch": "model.patch_size",
    "pool": "model.pool",
}


def model_section() -> ml_collections.ConfigDict:
  """The ViT's keys: a size from variants.VIT_SIZES, patches and pooling."""
  return variants.model_section(
      "vit_small",
      runlocal_size="vit_tiny",
      max_len=(keys.Auto(1), "positions of a text model (unused by the ViT)"),
      image_size=(8, "image side in pixels (the data's own side replaces it at build time)"),
      channels=(1, "image channels (the data's own replace it at build time)"),
      patch_size=(2, "patch side in pixels (must divide image_size)"),
      num_classes=(10, "classes (the data's own count replaces it at build time)"),
      pool=("cls", "cls (a class token) | mean (of the patch embeddings)"),
      causal=(False, "attention masks later positions (False: vision)"),
  )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = base.base_config()
  c.model = model_section()
  c.model.vocab_size = 10
  c.data.source, c.data.iid = "digits", True
  keys.auto_of(c, "data.eval_sequences").redefine(0, runlocal=0)  # every validation image
  keys.auto_of(c, "data.final_eval_sequences").redefine(0, runlocal=0)
  # 1,000 steps of 64 images (44 epochs of the 1,438 training images); BENCHMARKS.md has the
  # settings tried (600 steps of 32: 94.3%; 1,500: 95.5%; lr 1e-2: 91.5%; mean pooling: 95.7%).
  keys.auto_of(c, "seq_len").redefine(1, runlocal=1, compare=1)
  keys.auto_of(c, "batch_size").redefine(64, runlocal=16, compare=64)
  keys.auto_of(c, "steps").redefine(1000, runlocal=40, compare=1000)
  keys.auto_of(c, "optimizer.lr").redefine(3e-3, compare=3e-3)
  keys.auto_of(c, "optimizer.warmup_steps").redefine(30, runlocal=5)
  c.optimizer.weight_decay = 0.01
  keys.auto_of(c, "log_every").redefine(20, runlocal=5)
  keys.auto_of(c, "eval_every").redefine(200, runlocal=20, compare=200)
  keys.auto_of(c, "checkpoint_every").redefine(200, runlocal=200)
  # a few dozen tensors: 4 fragments
  keys.auto_of(c, "outer.fragments").redefine(decoupled=4)
  keys.auto_of(c, "compare.decoupled_fragments").redefine(compare=4)
  variants.apply(c, arg, VARIANTS)
  c.lock()
  return resolve.resolve(c)
