"""The programs a learner runs on its island, compiled for a TPU slice from abstract state only.

The island is built as a run builds it (`inner.island.island_mesh` and `step_fns`: the same
mesh, shardings, dtype, remat and jitted steps); the state is `jax.eval_shape` of its init and
the batches are `ShapeDtypeStruct`s, so nothing is allocated or initialised. Each program is
lowered and compiled by the TPU compiler, whose `memory_analysis()` (bytes per chip) and
`cost_analysis()` (FLOPs and HBM bytes per chip) are what a plan reports.
"""

import contextlib
import dataclasses
import math
import re
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from diloco.inner import checkpoint, island as island_lib, sharding, step as step_lib
from diloco.models import transformer
from diloco.outer import fragments


@dataclasses.dataclass(frozen=True)
class Compiled:
  """One compiled program's figures, per chip."""

  name: str
  argument_bytes: int
  output_bytes: int
  alias_bytes: int  # outputs that reuse a donated argument's buffer
  temp_bytes: int
  code_bytes: int
  peak_bytes: int  # max(arguments + outputs - aliased + temps, the compiler's peak estimate)
  flops: float
  hbm_bytes: float  # bytes the program reads and writes ("bytes accessed")
  compile_s: float
  refused: str = ""  # the TPU compiler's own refusal (temporaries past the HBM), if it refused


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """What `island.step_fns` needs of the data: the tokenizer's vocabulary, no corpus."""

  vocab_size: int
  image_shape: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Learner:
  """A learner's island for a slice: its model, steps, batches and fragments."""

  model_cfg: transformer.ModelConfig
  fns: step_lib.StepFns
  batch: int  # sequences per train step (the island's whole batch)
  eval_batch: int  # sequences per evaluation forward pass, a multiple of the chips
  seq_len: int
  param_count: int
  frag: fragments.Fragmentation | None  # None for mode=dp
  state: step_lib.TrainState  # abstract: ShapeDtypeStructs with the run's shardings

  @property
  def tokens_per_step(self) -> int:
    return self.batch * self.seq_len


def build(
    config: ml_collections.ConfigDict, devices: Sequence[jax.Device], vocab_size: int, batch: int
) -> Learner:
  """The learner island of `config` (checked) on `devices`, for a `vocab_size` tokenizer."""
  mesh = island_lib.island_mesh(config, devices)
  model_cfg, fns = island_lib.step_fns(config, mesh, Vocabulary(vocab_size), backend="tpu")
  shapes = jax.eval_shape(fns.init, jax.random.key(0))  # traced once: every program reuses it
  n = len(devices)
  eval_batch = -(-config.data.eval_batch_size // n) * n
  frag = None
  if config.mode != "dp":
    o = config.outer
    frag = fragments.make(o.fragment_kind, fragments.flatten(shapes.params), o.fragments)
  return Learner(
      model_cfg,
      fns,
      batch,
      eval_batch,
      config.seq_len,
      transformer.param_count(shapes.params),
      frag,
      checkpoint.abstract_like(shapes, fns.state_shardings),
  )


def abstract_batch(learner: Learner, batch: int, weights: bool = False) -> dict:
  """A [batch, seq_len] batch of token ids (and [batch] weights), sharded as a run's."""
  mesh = learner.fns.mesh

  out = {
      k: jax.ShapeDtypeStruct(
          (batch, learner.seq_len), jnp.int32, sharding=sharding.batch_sharding(mesh, 2)
      )
      for k in learner.model_cfg.batch_example()
  }
  if weights:
    out["weights_B"] = jax.ShapeDtypeStruct(
        (batch,), jnp.float32, sharding=sharding.batch_sharding(mesh, 1)
    )
  return out


@contextlib.contextmanager
def _not_cached():
  """Keeps compile-only TPU programs out of JAX's persistent cache (which a process may use for
  its own programs): such an executable cannot be read back without a TPU client."""
  key = "jax_persistent_cache_min_compile_time_secs"
  before = getattr(jax.config, key)
  jax.config.update(key, float("inf"))
  try:
    yield
  finally:
    jax.config.update(key, before)


# "Ran out of memory on HBM, the total memory required for HLO temporaries (20.99G) exceeds
# available HBM (15.75G)": XLA's human-readable sizes (G = 2**30 bytes).
_OUT_OF_HBM = re.compile(r"temporaries \((\d+(?:\.\d+)?)([KMGT])\) exceeds available HBM")


def _refused(name: str, error: Exception, seconds: float) -> Compiled:
  """A program the TPU compiler would not build because its temporaries exceed the chip."""
  found = _OUT_OF_HBM.search(str(error))
  if not found:
    raise error
  temps = int(float(found.group(1)) * 1024 ** ("KMGT".index(found.group(2)) + 1))
  line = str(error).splitlines()[0]
  return Compiled(name, 0, 0, 0, temps, 0, temps, 0.0, 0.0, seconds, refused=line)


def compile_one(name: str, lowered) -> Compiled:
  """Compiles `lowered` and reads its per-chip figures."""
  start = time.perf_counter()
  try:
    with _not_cached():
      compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    return _refused(name, e, time.perf_counter() - start)
  seconds = time.perf_counter() - start
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  args, outs, alias = mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes
  temps = mem.temp_size_in_bytes
  # The allocation XLA makes (MaxText's train_compile reports the same sum), or the compiler's
  # own liveness peak where that is larger: the fit check takes the worse of the two.
  peak = max(args + outs - alias + temps, getattr(mem, "peak_memory_in_bytes", 0))
  return Compiled(
      name=name,
      argument_bytes=int(args),
      output_bytes=int(outs),
      alias_bytes=int(alias),
      temp_bytes=int(temps),
      code_bytes=int(mem.generated_code_size_in_bytes),
      peak_bytes=int(peak),
      flops=float(cost.get("flops", 0.0)),
      hbm_bytes=float(cost.get("bytes accessed", 0.0)),
      compile_s=seconds,
  )


def train(learner: Learner) -> Compiled:
  """The inner step: (state, batch) -> (state, metrics), the state donated."""
  lowered = learner.fns.train.lower(learner.state, abstract_batch(learner, learner.batch))
  return compile_one("train step", lowered)


def evaluate(learner: Learner) -> Compiled:
  """One evaluation forward pass: the weighted sums of the held-out measures."""
  params = learner.state.params
  batch = abstract_batch(learner, learner.eval_batch, weights=True)
  return compile_one("eval step", learner.fns.measures.lower(params, batch))


def largest_fragment(learner: Learner) -> int:
  """The fragment with the most bytes (the one whose traffic and buffers bound the others)."""
  shapes = fragments.flatten(learner.state.params)
  sizes = [
      sum(math.prod(shapes[k].shape) * shapes[k].dtype.itemsize for k in paths)
      for paths in learner.frag.paths
  ]
  return int(np.argmax(sizes))


def fragment_bytes_per_chip(learner: Learner, p: int) -> int:
  """Bytes of fragment p held by one chip (its shards of the fragment's parameters)."""
  flat = fragments.flatten(learner.state.params)
  return int(
      sum(
          math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
          for x in (flat[k] for k in learner.frag.paths[p])
      )
  )


def receive(learner: Learner, p: int) -> Compiled:
  """A merged fragment p taking the place of the learner's own (`Learner._write`): the new values
  arrive sharded like the parameters and the old buffers are released once replaced."""
  params = learner.state.params
  flat = fragments.flatten(params)
  paths = learner.frag.paths[p]
  incoming = {k: flat[k] for k in paths}

  def put(params, values):
    return fragments.replace(params, values)

  shardings = jax.tree.map(lambda x: x.sharding, params)
  fn = jax.jit(put, out_shardings=shardings, donate_argnums=0)
  return compile_one(f"receive fragment {p}", fn.lower(params, incoming))
