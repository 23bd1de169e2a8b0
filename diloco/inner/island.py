"""One island: its mesh, data shard and compiled step, built from a config."""

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from absl import logging

from diloco import data as data_lib
from diloco.inner import checkpoint, sharding, step as step_lib, warm_start
from diloco.models import transformer, vit


@dataclasses.dataclass
class Island:
  """Everything one learner needs to take inner steps."""

  fns: step_lib.StepFns
  data: Any  # diloco.data.Datasets
  model_cfg: transformer.ModelConfig
  opt_cfg: step_lib.OptimizerConfig
  seed: int
  param_count: int
  flops_per_token: float
  init_params: Any = None  # host arrays from config.init_from (a warm start), or None

  def init_state(self) -> step_lib.TrainState:
    """A fresh state: step 0 and a fresh optimizer, with the warm start's params if any."""
    state = self.fns.init(jax.random.key(self.seed))
    if self.init_params is None:
      return state
    return state._replace(params=jax.device_put(self.init_params, self.fns.state_shardings.params))

  def abstract_state(self) -> step_lib.TrainState:
    shapes = jax.eval_shape(self.fns.init, jax.random.key(self.seed))
    return checkpoint.abstract_like(shapes, self.fns.state_shardings)

  def restore_or_init(self, ckpt: checkpoint.Checkpointer) -> tuple[step_lib.TrainState, int]:
    """The newest checkpoint (state and data position) if there is one, else a fresh state."""
    if ckpt.latest_step() is None:
      return self.init_state(), 0
    step, state = ckpt.restore(self.abstract_state(), self.data.train_iter)
    if jax.process_index() == 0:  # (a warning: shown at the mains' default verbosity)
      logging.warning("resumed from step %d (%s)", step, ckpt.step_dir(step))
    return state, step


def model_config(
    config: ml_collections.ConfigDict, data, backend: str | None = None
) -> transformer.ModelConfig:
  """The model's config: the decoder with the vocabulary the tokenizer actually has, or for image
  data the ViT with the images' size, channels and classes. `backend` names the platform the
  step is compiled for when it is not JAX's default (a plan for a TPU, made on a CPU): `auto`
  attention is then resolved for it."""
  model = {k: v for k, v in config.model.to_dict().items() if k != "size"}  # a shape preset
  if data.image_shape:
    h, w, c = data.image_shape
    if h != w:
      raise ValueError(f"images are {h}x{w}; the ViT takes square images")
    fields = {**model, "image_size": h, "channels": c}
    return vit.VitConfig(**{**fields, "num_classes": data.vocab_size})
  packed = getattr(data, "packed", False)  # (a plan's stand-in has no such field)
  cfg = transformer.ModelConfig(**{**model, "vocab_size": data.vocab_size, "packed": packed})
  if backend is not None:
    cfg = dataclasses.replace(cfg, attention=transformer.attention_kind(cfg.attention, backend))
  backend = backend or jax.default_backend()
  if cfg.attention == "cudnn" and backend != "gpu":
    raise ValueError(
        f"model.attention='cudnn' needs a GPU (this backend is {backend!r});"
        " use 'dot_product_attention' or 'einsum'"
    )
  return cfg


def optimizer_config(config: ml_collections.ConfigDict) -> step_lib.OptimizerConfig:
  return step_lib.OptimizerConfig(**config.optimizer.to_dict())


def island_mesh(config: ml_collections.ConfigDict, devices: Sequence[jax.Device]):
  """The island's mesh over `devices`, shaped by the config's `mesh` section."""
  m = config.mesh
  return sharding.make_island_mesh(devices, m.data, m.fsdp, m.get("expert", 1), m.get("tensor", 1))


def step_fns(
    config: ml_collections.ConfigDict, mesh, data, backend: str | None = None
) -> tuple[transformer.ModelConfig, step_lib.StepFns]:
  """The model's config and the island's jitted steps; `data` needs only `vocab_size` and
  `image_shape` (a plan passes what its tokenizer would give, without reading the corpus)."""
  model_cfg = model_config(config, data, backend)
  if config.seq_len > model_cfg.max_len:
    raise ValueError(f"seq_len={config.seq_len} exceeds model.max_len={model_cfg.max_len}")
  return model_cfg, step_lib.build_step_fns(model_cfg, optimizer_config(config), mesh)


def build_island(
    config: ml_collections.ConfigDict,
    devices: Sequence[jax.Device],
    shard_index: int = 0,
    num_shards: int = 1,
    splits=None,
    init_params=None,
) -> Island:
  """Mesh over `devices`, this shard's data, and the jitted step functions.

  `splits` (from diloco.data.load_splits) and `init_params` (an island's already built) avoid
  reading the corpus and the warm start's checkpoint again for every island.
  """
  mesh = island_mesh(config, devices)
  splits = data_lib.load_splits(config.data) if splits is None else splits
  data = data_lib.make_datasets(
      splits,
      config.data,
      seed=config.seed,
      global_batch_size=config.batch_size,
      seq_len=config.seq_len,
      shard_index=shard_index,
      num_shards=num_shards,
  )
  model_cfg, fns = step_fns(config, mesh, data)
  shapes = jax.eval_shape(fns.init, jax.random.key(0))
  if init_params is None and config.get("init_from"):
    init_params = warm_start.load_params(
        config.init_from, checkpoint.abstract_like(shapes, fns.state_shardings)
    )
  return Island(
      fns=fns,
      data=data,
      model_cfg=model_cfg,
      opt_cfg=optimizer_config(config),
      seed=config.seed,
      param_count=transformer.param_count(shapes.params),
      flops_per_token=(
          vit.flops_per_image(model_cfg)
          if isinstance(model_cfg, vit.VitConfig)
          else transformer.flops_per_token(model_cfg, config.seq_len)
      ),
      init_params=init_params,
  )
