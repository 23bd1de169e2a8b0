"""M learners' train states stacked on a leading learner axis and stepped as one vmapped step.

A `Stack` holds the states [M, ...] on a ('learners', 'data', 'fsdp') mesh and, per learner, the
steps it has started but nobody has needed yet. A step is only queued; reading or writing a
learner's state first runs its queued steps in *waves*: one jitted `vmap` of the island's pure
step over all M learners, where a learner without a queued step is masked (its state comes out
unchanged). Other learners' queued steps ride along in the same wave, so learners whose steps fall
between the same two reads are stepped together; a wave in which every learner has a step is
dispatched at once (asynchronously, so the device works while the host goes on). Each learner's steps still run in the order they
were started and see exactly the writes made before them: the arithmetic per learner is that of the
single step, up to the order of float reductions in a batched matmul.

Masking rather than grouping keeps one compiled shape and no gather or scatter of states; a wave
costs the same whether one learner or all M have a step in it (`occupancy` counts how full the
waves were). Rows are read and written per leaf on the devices that hold them (writes donated, so
in place), with no collective and never by copying the stack.
"""

import collections
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from diloco.inner import sharding, step as step_lib
from diloco.models import layer_stack, transformer


@dataclasses.dataclass(frozen=True)
class StackedFns:
  """The compiled stacked step of `size` learners and the shardings it was built with."""

  size: int
  kind: str  # 'vmap' | 'map'
  mesh: Mesh
  state_shardings: step_lib.TrainState
  batch_sharding: dict[str, NamedSharding]  # per batch key
  zeros: Any  # () -> stacked TrainState of zeros
  train: Any  # (stacked state, batch [M, B, L], mask [M]) -> (stacked state, metrics [M])


STEPS = ("vmap", "map")


def _vmapped(train, size: int):
  """All learners in one vmapped step; a masked learner is computed and its result dropped."""
  stepped = jax.vmap(train, spmd_axis_name=sharding.LEARNERS)

  def run(state_M, batch_M, mask_M):
    new_M, metrics_M = stepped(state_M, batch_M)

    def keep(new, old):
      return jnp.where(mask_M.reshape((size,) + (1,) * (new.ndim - 1)), new, old)

    return jax.tree.map(keep, new_M, state_M), metrics_M

  return run


def _mapped(train, metric_shapes):
  """One learner after the other inside the step (lax.map); a masked learner is skipped."""

  def one(args):
    state, batch, active = args
    skip = lambda s, b: (s, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metric_shapes))
    return lax.cond(active, train, skip, state, batch)

  return lambda state_M, batch_M, mask_M: lax.map(one, (state_M, batch_M, mask_M))


@functools.cache
def build_stacked_fns(
    model_cfg: transformer.ModelConfig,
    opt_cfg: step_lib.OptimizerConfig,
    mesh: Mesh,
    size: int,
    kind: str = "vmap",
) -> StackedFns:
  """Jits the step of `size` stacked learners over `mesh` (a make_stacked_mesh), with donation:
  `kind` 'vmap' steps them as one vmapped step, 'map' one after the other in one program."""
  if size % mesh.shape[sharding.LEARNERS]:
    raise ValueError(f"{size} learners do not split over {mesh.shape[sharding.LEARNERS]} rows")
  if kind not in STEPS:
    raise ValueError(f"unknown stacked step {kind!r}; expected one of {STEPS}")
  fns = step_lib.pure_fns(model_cfg, opt_cfg)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct((size, *x.shape), x.dtype), fns.shapes)
  state_sh = sharding.tree_shardings(shapes, mesh, lead=(sharding.LEARNERS,))
  example = model_cfg.batch_example()
  batch_sh = {
      k: sharding.batch_sharding(mesh, x.ndim, lead=(sharding.LEARNERS,))
      for k, x in example.items()
  }
  mask_sh = NamedSharding(mesh, P(sharding.LEARNERS))
  rep = sharding.replicated(mesh)
  if kind == "vmap":
    train = _vmapped(fns.train, size)
  else:
    train = _mapped(fns.train, jax.eval_shape(fns.train, fns.shapes, example)[1])

  def zeros():
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  return StackedFns(
      size=size,
      kind=kind,
      mesh=mesh,
      state_shardings=state_sh,
      batch_sharding=batch_sh,
      zeros=jax.jit(zeros, out_shardings=state_sh),
      train=jax.jit(
          train,
          in_shardings=(state_sh, batch_sh, mask_sh),
          out_shardings=(state_sh, rep),
          donate_argnums=0,
      ),
  )


def _holders(leaves_MxS: Sequence[jax.Array], i: int) -> list[tuple[Any, int, list]]:
  """(device, i's index in its block, [(leaf number, shard)]) for each device holding a part of
  learner i's row; every leaf splits the learner axis alike, so the index is per device."""
  out: dict[Any, tuple[Any, int, list]] = {}
  for n, x in enumerate(leaves_MxS):
    for shard in x.addressable_shards:
      start, stop, _ = shard.index[0].indices(x.shape[0])
      if start <= i < stop:
        out.setdefault(shard.device, (shard.device, i - start, []))[2].append((n, shard))
  return list(out.values())


@jax.jit
def _take_local(xs_KxS: tuple, j: jax.Array) -> tuple:
  return tuple(lax.dynamic_index_in_dim(x, j, 0, keepdims=False) for x in xs_KxS)


@functools.partial(jax.jit, donate_argnums=0)
def _put_local(xs_KxS: tuple, j: jax.Array, vs_S: tuple) -> tuple:
  return tuple(
      lax.dynamic_update_index_in_dim(x, v.astype(x.dtype), j, 0) for x, v in zip(xs_KxS, vs_S)
  )


def get_rows(leaves_MxS: Sequence[jax.Array], i: int) -> list[np.ndarray]:
  """Learner i's rows of these stacked leaves, on the host: one program per device that holds a
  part (no collective: a dynamic index into an axis split over devices would gather the whole
  stack everywhere, and XLA's CPU collectives can time out when the host is busy)."""
  holders = _holders(leaves_MxS, i)
  fetched = jax.device_get(
      [_take_local(tuple(s.data for _, s in items), np.int32(j)) for _, j, items in holders]
  )
  out = [np.empty(x.shape[1:], x.dtype) for x in leaves_MxS]
  for (_, _, items), values in zip(holders, fetched):
    for (n, shard), value in zip(items, values):
      out[n][shard.index[1:]] = value
  return out


def set_rows(leaves_MxS: Sequence[jax.Array], i: int, values: Sequence[Any]) -> list[jax.Array]:
  """These stacked leaves with learner i's rows replaced, in place (each device's blocks that
  hold the row are donated to one program; the other blocks are kept as they are)."""
  values = [np.asarray(jax.device_get(v)) for v in values]
  for x, v in zip(leaves_MxS, values, strict=True):
    if v.shape != x.shape[1:]:
      raise ValueError(f"row of shape {v.shape} for a stack of rows {x.shape[1:]}")
  shapes, shardings = [x.shape for x in leaves_MxS], [x.sharding for x in leaves_MxS]
  shards = [x.addressable_shards for x in leaves_MxS]  # before donation deletes the old arrays
  replaced: dict[tuple[int, Any], jax.Array] = {}
  for device, j, items in _holders(leaves_MxS, i):
    blocks = tuple(s.data for _, s in items)
    parts = tuple(values[n][s.index[1:]] for n, s in items)
    for (n, s), new in zip(items, _put_local(blocks, np.int32(j), parts)):
      replaced[(n, device)] = new
  out = []
  for n, (x_shape, sh) in enumerate(zip(shapes, shardings)):
    buffers = [replaced.get((n, s.device), s.data) for s in shards[n]]
    if len(buffers) == 1:
      out.append(buffers[0])
    else:
      out.append(jax.make_array_from_single_device_arrays(x_shape, sh, buffers))
  return out


class Wave:
  """The metrics [M] of one wave, fetched to the host once, when first asked for."""

  def __init__(self, metrics_M: dict[str, jax.Array]):
    self._device, self._host = metrics_M, None

  def host(self) -> dict[str, np.ndarray]:
    if self._host is None:
      self._host = jax.device_get(self._device)
    return self._host


class PendingMetrics(Mapping):
  """A queued step's metrics: asking for one runs the step (and what is queued before it)."""

  def __init__(self, stack: "Stack", i: int):
    self._stack, self._i = stack, i
    self._wave: Wave | None = None

  def _resolve(self) -> dict[str, np.ndarray]:
    if self._wave is None:
      self._stack.flush(self._i)
    return {k: v[self._i] for k, v in self._wave.host().items()}

  def __getitem__(self, key: str):
    return self._resolve()[key]

  def __iter__(self):
    return iter(self._resolve())

  def __len__(self) -> int:
    return len(self._resolve())


class Stack:
  """The stacked states of `fns.size` learners and the steps each has queued."""

  def __init__(self, fns: StackedFns):
    self.fns = fns
    self.state = fns.zeros()
    flat, self._params_tree = jax.tree_util.tree_flatten_with_path(self.state.params)
    self.paths = [sharding.path_str(path) for path, _ in flat]  # '/'-joined, in leaf order
    self._queues: list[collections.deque] = [collections.deque() for _ in range(fns.size)]
    self.waves = 0
    self.steps = 0  # learner steps taken in waves

  @property
  def occupancy(self) -> float:
    """Mean share of the M slots of a wave that had a step to take."""
    return self.steps / (self.waves * self.fns.size) if self.waves else 0.0

  def enqueue(self, i: int, batch: dict[str, np.ndarray]) -> PendingMetrics:
    """Queues one step of learner i on this batch; returns its metrics, computed when asked."""
    pending = PendingMetrics(self, i)
    self._queues[i].append((batch, pending))
    if all(self._queues):  # a full wave waits for nobody: dispatch it now, to overlap host work
      self._wave()
    return pending

  def flush(self, i: int) -> None:
    """Runs learner i's queued steps (and, alongside, those queued by the others)."""
    while self._queues[i]:
      self._wave()

  def _wave(self) -> None:
    items = [q.popleft() if q else None for q in self._queues]
    like = next(item[0] for item in items if item is not None)
    batch_M = {
        k: np.stack([item[0][k] if item else np.zeros_like(v) for item in items])
        for k, v in like.items()
    }
    batch_M = jax.device_put(batch_M, self.fns.batch_sharding)
    mask_M = np.array([item is not None for item in items])
    self.state, metrics_M = self.fns.train(self.state, batch_M, mask_M)
    wave = Wave(metrics_M)
    for item in items:
      if item is not None:
        item[1]._wave = wave
    self.waves += 1
    self.steps += int(mask_M.sum())

  def read(self, i: int, paths: Sequence[str]) -> dict[str, np.ndarray]:
    """Learner i's values of these parameters ('/'-joined paths; a scanned model's blocks as
    their `blocks/{j}/...` views), on the host."""
    self.flush(i)
    leaves = self._params_by_path()
    sources = list(dict.fromkeys(k if k in leaves else layer_stack.view_of(k)[0] for k in paths))
    rows = dict(zip(sources, get_rows([leaves[k] for k in sources], i)))
    return {k: rows[k] if k in rows else layer_stack.read(rows, k) for k in paths}

  def write(self, i: int, values: Mapping[str, Any]) -> None:
    """Replaces learner i's values of these parameters (in place: the old blocks are donated)."""
    self.flush(i)
    leaves = self._params_by_path()
    # the rows of the stacked leaves that views replace layers of, rebuilt on the host
    sources = list(dict.fromkeys(layer_stack.view_of(k)[0] for k in values if k not in leaves))
    held = dict(zip(sources, get_rows([leaves[k] for k in sources], i)))
    rows = layer_stack.write(held, {k: np.asarray(jax.device_get(v)) for k, v in values.items()})
    keys = list(rows)
    leaves.update(zip(keys, set_rows([leaves[k] for k in keys], i, [rows[k] for k in keys])))
    params = jax.tree.unflatten(self._params_tree, list(leaves.values()))
    self.state = self.state._replace(params=params)

  def get_state(self, i: int) -> step_lib.TrainState:
    """Learner i's whole train state, on the host."""
    self.flush(i)
    leaves, tree = jax.tree.flatten(self.state)
    return jax.tree.unflatten(tree, get_rows(leaves, i))

  def set_state(self, i: int, state: step_lib.TrainState) -> None:
    """Replaces learner i's whole train state."""
    self.flush(i)
    leaves, tree = jax.tree.flatten(self.state)
    self.state = jax.tree.unflatten(tree, set_rows(leaves, i, jax.tree.leaves(state)))

  def _params_by_path(self) -> dict[str, jax.Array]:
    """The stacked parameters by '/'-joined path, in the tree's leaf order."""
    return dict(zip(self.paths, jax.tree.leaves(self.state.params), strict=True))
