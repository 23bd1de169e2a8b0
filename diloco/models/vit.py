"""A vision transformer in flax nnx: patches in, the decoder's blocks without the causal mask,
a class token or mean pooling, a linear classifier.

Parameter tree:
  patch/kernel   [P*P*C, D]  (patches of P x P pixels of C channels, flattened row-major)
  cls            [D]         (pool='cls' only)
  blocks/{i}/... as in models/transformer.py (dense or mixture-of-experts blocks)
  final_norm/scale [D]
  head/kernel    [D, K]
Position enters through the blocks' rotary embeddings over the patch sequence (the class token
first, then the patches row by row).
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from diloco.models import blocks, losses, transformer

POOLS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class VitConfig(transformer.ModelConfig):
  """The blocks' sizes (ModelConfig's fields) and the image side of the model."""

  image_size: int = 8  # height = width, in pixels
  channels: int = 1
  patch_size: int = 2
  num_classes: int = 10
  pool: str = "cls"
  causal: bool = False

  def __post_init__(self):
    super().__post_init__()
    if self.patch_size < 1 or self.image_size % self.patch_size:
      raise ValueError(
          f"model.image_size={self.image_size} is not divisible by model.patch_size="
          f"{self.patch_size}"
      )
    if self.pool not in POOLS:
      raise ValueError(f"model.pool={self.pool!r}: expected one of {POOLS}")
    if self.num_classes < 2 or self.channels < 1:
      raise ValueError(
          f"model.num_classes={self.num_classes} and model.channels={self.channels}: need >= 2 "
          "and >= 1"
      )

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  def batch_example(self, batch: int = 1) -> dict[str, jax.ShapeDtypeStruct]:
    """Images and their labels."""
    side, c = self.image_size, self.channels
    return {
        "images_BxHxWxC": jax.ShapeDtypeStruct((batch, side, side, c), jnp.float32),
        "labels_B": jax.ShapeDtypeStruct((batch,), jnp.int32),
    }

  def build(self, rngs: nnx.Rngs) -> "ViT":
    return ViT(self, rngs)


def patches(images_BxHxWxC: jax.Array, p: int) -> jax.Array:
  """[B, H, W, C] -> [B, (H/p)*(W/p), p*p*C], patches row by row, each flattened row-major."""
  b, h, w, c = images_BxHxWxC.shape
  x = images_BxHxWxC.reshape(b, h // p, p, w // p, p, c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // p) * (w // p), p * p * c)


class ViT(nnx.Module):
  """Image classifier: patch embedding, the transformer's blocks (bidirectional), pooling."""

  def __init__(self, cfg: VitConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    d, k = cfg.d_model, cfg.patch_size**2 * cfg.channels
    self.patch = nnx.Linear(k, d, use_bias=False, rngs=rngs)
    if cfg.pool == "cls":
      self.cls = nnx.Param(jnp.zeros((d,), jnp.float32))
    layers = [transformer.Block(cfg, rngs, cfg.is_moe(i)) for i in range(cfg.num_layers)]
    blocks.set_blocks(self, layers)
    self.final_norm = transformer.RMSNorm(d)
    self.head = nnx.Linear(d, cfg.num_classes, use_bias=False, rngs=rngs)

  def forward(self, images_BxHxWxC: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Class logits [B, K] and the routing stats of blocks.run_blocks."""
    cfg = self.cfg
    x_BxNxD = self.patch(patches(images_BxHxWxC, cfg.patch_size)).astype(cfg.dtype)
    if cfg.pool == "cls":
      cls_Bx1xD = jnp.broadcast_to(
          self.cls[...].astype(cfg.dtype), (x_BxNxD.shape[0], 1, cfg.d_model)
      )
      x_BxNxD = jnp.concatenate([cls_Bx1xD, x_BxNxD], axis=1)
    x_BxNxD, aux = blocks.run_blocks(cfg, blocks.blocks_of(self), x_BxNxD)
    x_BxNxD = self.final_norm(x_BxNxD)
    pooled_BxD = x_BxNxD[:, 0] if cfg.pool == "cls" else jnp.mean(x_BxNxD, axis=1)
    return self.head(pooled_BxD).astype(jnp.float32), aux

  def __call__(self, images_BxHxWxC: jax.Array) -> jax.Array:
    return self.forward(images_BxHxWxC)[0]

  def objective(self, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    logits_BxK, aux = self.forward(batch["images_BxHxWxC"])
    loss = losses.cross_entropy(logits_BxK, batch["labels_B"])
    metrics = {"loss": loss, "accuracy": _accuracy(logits_BxK, batch["labels_B"]), **aux}
    return losses.with_aux_losses(self.cfg, loss, aux), metrics

  def evaluate(self, batch) -> dict[str, jax.Array]:
    """The held-out measures of each image [B]: cross entropy and whether the top class is right."""
    logits_BxK, labels_B = self(batch["images_BxHxWxC"]), batch["labels_B"]
    return {
        "loss": losses.token_nll(logits_BxK, labels_B),
        "accuracy": (jnp.argmax(logits_BxK, axis=-1) == labels_B).astype(jnp.float32),
    }


def flops_per_image(cfg: VitConfig) -> float:
  """Training FLOPs per image: transformer.flops_per_token's count over the patch sequence,
  with the patch embedding and the head in place of the vocabulary."""
  n = cfg.num_patches + (cfg.pool == "cls")
  blocks = transformer.flops_per_token(dataclasses.replace(cfg, vocab_size=0), n)
  embed = cfg.num_patches * cfg.patch_size**2 * cfg.channels * cfg.d_model
  return n * blocks + 6.0 * (embed + cfg.d_model * cfg.num_classes)


def _accuracy(logits_BxK: jax.Array, labels_B: jax.Array) -> jax.Array:
  return jnp.mean((jnp.argmax(logits_BxK, axis=-1) == labels_B).astype(jnp.float32))
