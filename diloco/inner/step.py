"""The pure inner step: (state, batch) -> (state, metrics), jitted over one island's mesh."""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from diloco.inner import sharding
from diloco.models import transformer

Params = dict[str, Any]


class TrainState(NamedTuple):
  step: jax.Array  # int32 scalar: inner steps taken
  params: Params  # pure dict, see models/transformer.py
  opt_state: optax.OptState


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Inner optimizer: AdamW (or SGD) with linear warmup, cosine decay and global-norm clipping."""

  name: str = "adamw"
  lr: float = 3e-3
  warmup_steps: int = 50
  # cosine from lr to lr * min_lr_ratio over these steps after warmup: the rate of step
  # warmup_steps + decay_steps is exactly lr * min_lr_ratio (lr_schedule)
  decay_steps: int = 1000
  min_lr_ratio: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  weight_decay: float = 0.1  # coupled: optax's, multiplied by the scheduled lr
  # independent: matrices shrink by (lr_t / lr) / weight_decay_time_constant per step
  weight_decay_kind: str = "coupled"
  weight_decay_time_constant: int = 0  # T of the independent decay (lambda = 1/T)
  clip_norm: float = 1.0  # 0 disables clipping

  def optax_weight_decay(self) -> float:
    """optax.adamw's weight_decay: as given (coupled), or 1/(T * lr), the independent decay
    lambda = 1/T per step at the peak lr scaled by lr_t / lr (Wortsman et al. 2023)."""
    if self.weight_decay_kind == "coupled":
      return self.weight_decay
    if self.weight_decay_kind != "independent" or self.weight_decay_time_constant < 1:
      raise ValueError(
          f"optimizer.weight_decay_kind={self.weight_decay_kind!r} with "
          f"weight_decay_time_constant={self.weight_decay_time_constant}: expected coupled, or "
          "independent with a time constant >= 1"
      )
    return 1.0 / (self.weight_decay_time_constant * self.lr)


def lr_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  """0 -> lr linearly over warmup_steps, then a cosine to lr * min_lr_ratio, reached at step
  warmup_steps + decay_steps (a run's `steps` when decay_steps is derived: the last update,
  of step steps - 1, is a hair above it) and held after."""
  if cfg.warmup_steps == 0 and cfg.decay_steps == 0:
    return optax.constant_schedule(cfg.lr)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if cfg.warmup_steps else cfg.lr,
      peak_value=cfg.lr,
      warmup_steps=cfg.warmup_steps,
      decay_steps=cfg.warmup_steps + max(cfg.decay_steps, 1),
      end_value=cfg.lr * cfg.min_lr_ratio,
  )


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """The inner optimizer; weight decay skips vectors (norm scales)."""
  schedule = lr_schedule(cfg)
  if cfg.name == "adamw":
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)
    opt = optax.adamw(
        schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.optax_weight_decay(), mask=decay_mask
    )
  elif cfg.name == "sgd":
    opt = optax.sgd(schedule)
  else:
    raise ValueError(f"unknown inner optimizer {cfg.name!r}; expected 'adamw' or 'sgd'")
  if cfg.clip_norm > 0:
    opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
  return opt


def schedule_count(opt_state: optax.OptState, default: jax.Array) -> jax.Array:
  """Where the optimizer's learning-rate schedule is (its ScaleByScheduleState's count): the
  inner step, unless a restart moved it (`restarted`); `default` if it has none."""
  if isinstance(opt_state, optax.ScaleByScheduleState):
    return opt_state.count
  if isinstance(opt_state, tuple):
    for s in opt_state:
      if (found := schedule_count(s, None)) is not None:
        return found
  return default


def restarted(opt_state: optax.OptState, schedule_count: int | None, fresh: bool) -> optax.OptState:
  """The inner optimizer's state for a learner that restarts from a merged model: `fresh`
  zeroes its moments and counts (Adam's bias correction starts again), and `schedule_count`
  (None: kept) sets where its learning-rate schedule is. Arrays keep their shardings."""

  def put(x, value):
    return jax.device_put(np.full(x.shape, value, x.dtype), x.sharding)

  def walk(s):
    if isinstance(s, optax.ScaleByScheduleState):
      return s if schedule_count is None else s._replace(count=put(s.count, schedule_count))
    if isinstance(s, tuple):  # optax's states are (named) tuples of states and trees
      children = [walk(x) for x in s]
      return type(s)(*children) if hasattr(s, "_fields") else type(s)(children)
    return jax.tree.map(lambda x: put(x, 0), s) if fresh else s

  return walk(opt_state)


@dataclasses.dataclass(frozen=True)
class StepFns:
  """Compiled step functions and the shardings they were built with, for one island."""

  graphdef: nnx.GraphDef
  mesh: Mesh
  state_shardings: TrainState
  init: Any  # (rng) -> TrainState
  train: Any  # (TrainState, batch) -> (TrainState, metrics)
  eval: Any  # (params, batch) -> loss
  measures: Any  # (params, batch with weights_B) -> weighted sums {loss, ..., weight}
  lr: optax.Schedule


def abstract_state(model_cfg: transformer.ModelConfig, tx) -> tuple[nnx.GraphDef, TrainState]:
  """Graphdef and shapes of the train state, without allocating it."""

  def build():
    model = model_cfg.build(nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model))
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

  graphdef = nnx.graphdef(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0))))
  return graphdef, jax.eval_shape(build)


@dataclasses.dataclass(frozen=True)
class PureFns:
  """The step functions before jit: what single and stacked (vmapped) steps are built from."""

  graphdef: nnx.GraphDef
  shapes: TrainState  # abstract
  init: Any  # (rng) -> TrainState
  train: Any  # (TrainState, batch) -> (TrainState, metrics)
  loss: Any  # (params, batch) -> loss
  measures: Any  # (params, batch with weights_B) -> weighted sums {loss, ..., weight}
  lr: optax.Schedule


@functools.cache
def pure_fns(model_cfg: transformer.ModelConfig, opt_cfg: OptimizerConfig) -> PureFns:
  """init, train and loss as pure functions of one learner's state and batch."""
  tx = make_optimizer(opt_cfg)
  schedule = lr_schedule(opt_cfg)
  graphdef, shapes = abstract_state(model_cfg, tx)

  def init(rng: jax.Array) -> TrainState:
    model = model_cfg.build(nnx.Rngs(params=rng))
    params = nnx.to_pure_dict(nnx.state(model))
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

  def measures(params, batch) -> dict[str, jax.Array]:
    """Sums over the rows of the held-out measures of the model's task (`loss`, and e.g.
    `accuracy`), each row weighted by `weights_B`, and `weight`, the sum of the weights."""
    weights_B = batch["weights_B"]
    rows = {k: v for k, v in batch.items() if k != "weights_B"}
    per_row = nnx.merge(graphdef, params).evaluate(rows)
    sums = {k: jnp.sum(v_B * weights_B) for k, v_B in per_row.items()}
    return {**sums, "weight": jnp.sum(weights_B)}

  def loss_fn(params, batch) -> jax.Array:
    return jnp.mean(nnx.merge(graphdef, params).evaluate(batch)["loss"])

  def objective(params, batch):
    """What training minimises (the task's loss plus, for a mixture of experts, the weighted
    auxiliary losses) and its parts as metrics."""
    return nnx.merge(graphdef, params).objective(batch)

  def train(state: TrainState, batch) -> tuple[TrainState, dict[str, jax.Array]]:
    (_, parts), grads = jax.value_and_grad(objective, has_aux=True)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    lr = schedule(schedule_count(state.opt_state, state.step))  # (the rate this update used)
    metrics = {**parts, "grad_norm": optax.tree.norm(grads), "lr": lr}
    return TrainState(state.step + 1, params, opt_state), metrics

  return PureFns(graphdef, shapes, init, train, loss_fn, measures, schedule)


@functools.cache
def build_step_fns(
    model_cfg: transformer.ModelConfig, opt_cfg: OptimizerConfig, mesh: Mesh
) -> StepFns:
  """Jits init, train and eval steps with explicit shardings over `mesh` and donation.

  Cached: islands (and tests) with the same model, optimizer and mesh share one compilation.
  """
  fns = pure_fns(model_cfg, opt_cfg)
  state_sh = TrainState(*(sharding.tree_shardings(x, mesh) for x in fns.shapes))
  batch_sh = {
      k: sharding.batch_sharding(mesh, x.ndim) for k, x in model_cfg.batch_example().items()
  }
  rep = sharding.replicated(mesh)
  eval_sh = {**batch_sh, "weights_B": sharding.batch_sharding(mesh, 1)}
  in_mesh = functools.partial(_in_mesh, mesh)
  return StepFns(
      graphdef=fns.graphdef,
      mesh=mesh,
      state_shardings=state_sh,
      init=jax.jit(fns.init, in_shardings=rep, out_shardings=state_sh),
      train=jax.jit(
          in_mesh(fns.train),
          in_shardings=(state_sh, batch_sh),
          out_shardings=(state_sh, rep),
          donate_argnums=0,
      ),
      eval=jax.jit(in_mesh(fns.loss), in_shardings=(state_sh.params, batch_sh), out_shardings=rep),
      measures=jax.jit(
          in_mesh(fns.measures), in_shardings=(state_sh.params, eval_sh), out_shardings=rep
      ),
      lr=fns.lr,
  )


def _in_mesh(mesh: Mesh, fn):
  """`fn` traced with `mesh` as the abstract mesh in context: a kernel that must be mapped over
  the batch's devices (splash attention's shard_map) finds its axes there."""

  @functools.wraps(fn)
  def traced(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args)

  return traced


def put_batch(batch: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
  """This process's slice of a global batch -> a global array sharded over the island."""
  return {
      k: jax.make_array_from_process_local_data(sharding.batch_sharding(mesh, v.ndim), v)
      for k, v in batch.items()
  }
