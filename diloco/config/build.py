"""The one place that turns a multi-learner config into the parts of a run.

Every runtime builds from here: the virtual runner and the threads runtime all learners on
sub-meshes of the local devices, a gRPC learner process one learner on all of its JAX job's
devices, the gRPC synchronizer process only the initial parameters (on one device). The parts are
the islands, fragmentation and schedule, the learner factory, the synchronizer factory (outer
optimizer through the validated registry, policy, outlier screen, checkpoint interval), and the
fault schedule with what recovers from it.
"""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from diloco import data as data_lib
from diloco.chaos import schedule as chaos
from diloco.inner import island as island_lib, sharding, stacked, step as step_lib
from diloco.outer import fragments, integrity, optimizers, policies
from diloco.outer.sync import ownership
from diloco.outer.learner.learner import Learner
from diloco.outer.learner.stacked_learner import StackedLearner
from diloco.outer.codecs.uplink import Uplink
from diloco.outer.sync.sharded import ShardedSynchronizer
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.recovery import rejoin


def parse_list(text: str, n: int, kind: type, default: Any, what: str) -> list:
  """'1,1,3' -> [1, 1, 3]; empty -> n copies of default; wrong length fails clearly."""
  if not text:
    return [default] * n
  try:
    values = [kind(x) for x in str(text).split(",")]
  except ValueError as e:
    raise ValueError(f"{what}={text!r} is not a comma-separated list of {kind.__name__}") from e
  if len(values) != n:
    raise ValueError(f"{what}={text!r} has {len(values)} entries for {n} learners")
  return values


def batch_sizes(config: ml_collections.ConfigDict) -> list[int]:
  """Each learner's batch (sequences): `sim.batch_sizes`, else `batch_size` for all."""
  out = parse_list(
      config.sim.batch_sizes, config.outer.learners, int, config.batch_size, "sim.batch_sizes"
  )
  if any(b <= 0 for b in out):
    raise ValueError(f"sim.batch_sizes must be positive, got {config.sim.batch_sizes!r}")
  return out


def eval_batch_size(config: ml_collections.ConfigDict) -> int:
  """The batch (sequences) of the island that evaluates: mode=dp's one island, else learner 0's
  (the multi-learner runners evaluate the global model there)."""
  return config.batch_size if config.mode == "dp" else batch_sizes(config)[0]


def split_devices(devices: Sequence, m: int) -> list[list]:
  """M islands of len(devices) // M devices each; with fewer devices than M, islands share."""
  if m < 1:
    raise ValueError(f"need at least one learner, got {m}")
  if m > len(devices):
    return [[devices[i % len(devices)]] for i in range(m)]
  k = len(devices) // m
  return [list(devices[i * k : (i + 1) * k]) for i in range(m)]


def learner_devices(config: ml_collections.ConfigDict) -> list[list]:
  """Each learner's share of the local devices: split evenly, or `deploy.devices_per_learner`
  each (when set) from the first ones."""
  devices, m_count = jax.devices(), config.outer.learners
  per = int(config.deploy.get("devices_per_learner", 0)) if "deploy" in config else 0
  if per < 0 or per * m_count > len(devices):
    raise ValueError(
        f"deploy.devices_per_learner={per} x {m_count} learners does not fit "
        f"{len(devices)} local devices"
    )
  return split_devices(devices[: per * m_count] if per else devices, m_count)


def outer_optimizer(o: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The `outer` section's optimizer, through the validated registry of outer/optimizers.py."""
  kwargs = {
      "nesterov": dict(lr=o.lr, momentum=o.momentum),
      "sgd": dict(lr=o.lr),
      "delayed_nesterov": dict(
          lr=o.lr, momentum=o.momentum, period=o.delayed_period, c=o.delayed_c
      ),
  }
  return optimizers.make_outer(o.optimizer, **kwargs.get(o.optimizer, {}))


def outlier_screen(o: ml_collections.ConfigDict) -> integrity.OutlierScreen | None:
  """The synchronizer's outlier screen (and clip) of an `outer` section; None when off."""
  if o.outlier_factor <= 0:
    return None
  return integrity.OutlierScreen(
      o.outlier_factor,
      o.outlier_history,
      o.outlier_window,
      clip_factor=o.get("clip_factor", 0.0),
      period=o.inner_steps,
  )


def faults(config: ml_collections.ConfigDict) -> list[chaos.Fault]:
  """The run's fault schedule (the `chaos` section), checked against its checkpoint settings."""
  out = chaos.from_config(
      config.chaos, config.outer.learners, horizon_s=config.steps * config.sim.step_s
  )
  if any(f.kind == "sync_crash" for f in out) and not config.outer.sync_checkpoint_every:
    raise ValueError(
        "sync_crash faults need synchronizer checkpoints: set outer.sync_checkpoint_every > 0"
    )
  return out


def initial_params(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """The initial global parameters every learner builds, computed on one device (the values do
  not depend on how a mesh shards them)."""
  one = config.copy_and_resolve_references()
  one.mesh.data, one.mesh.fsdp = 1, 1
  if "expert" in one.mesh:
    one.mesh.expert = 1
  isl = island_lib.build_island(one, jax.devices()[:1], splits=data_lib.load_splits(config.data))
  return fragments.flatten(jax.device_get(isl.init_state().params))


@dataclasses.dataclass
class Parts:
  """Islands (learner index -> island), the global parameters' start and how they are cut."""

  config: ml_collections.ConfigDict
  islands: dict[int, island_lib.Island]
  params0: dict[str, np.ndarray]
  frag: fragments.Fragmentation
  schedule: fragments.Schedule
  batches: list[int]
  learner_cls: type[Learner] = Learner
  sync_cls: type[Synchronizer] = Synchronizer  # a test may record what its synchronizer does
  syncs: list[Synchronizer] = dataclasses.field(default_factory=list)  # made so far, in order
  rows: dict[int, tuple[stacked.Stack, int]] = dataclasses.field(default_factory=dict)
  owner_of: tuple[int, ...] = ()  # each fragment's synchronizer shard (`outer.sync_shards`)

  def __post_init__(self):
    sizes = [self.frag.nbytes(p, self.params0) for p in range(self.frag.num_fragments)]
    self.owner_of = ownership.owners(sizes, int(self.config.outer.sync_shards))

  def make_learner(self, m: int, holds_start: bool = False) -> Learner:
    """Learner m with a fresh state, holding no fragment (versions -1: its Join fetches all),
    or (`holds_start`) holding and training from `params0` at version 0; on its row of a stack
    when the learners are stacked (`stack`)."""
    o = self.config.outer
    args = (m, self.islands[m], self.frag, self.schedule, o.codec, o.alpha)
    tokens = self.batches[m] * self.config.seq_len
    kwargs = dict(
        uplink=Uplink(o.codec, o.fp4_rounding, o.error_feedback, seed=(self.config.seed, m)),
        holds_nothing=not holds_start,
        start=self.params0 if holds_start else None,
        owner_of=self.owner_of,
        delivery=o.delivery,
        overlap=int(o.overlap),
        anchor=o.anchor,
        fresh_optimizer=o.get("fresh_inner_optimizer", False),
        schedule_by=o.get("schedule_by", "own"),
        learners=int(o.learners),
    )
    if m in self.rows:
      stack, row = self.rows[m]
      return StackedLearner(*args, tokens, stack=stack, row=row, **kwargs)
    return self.learner_cls(*args, tokens, **kwargs)

  def stack(self) -> None:
    """Puts the learners on stacks, one per batch size (`stack_mesh`): the virtual runtime."""
    groups: dict[int, list[int]] = {}
    for m in sorted(self.islands):
      groups.setdefault(self.batches[m], []).append(m)
    for batch, members in groups.items():
      mesh = stack_mesh(self.config, [self.islands[m].fns.mesh for m in members])
      isl = self.islands[members[0]]
      model_cfg, tokens = isl.model_cfg, batch * self.config.seq_len
      rows = mesh.shape[sharding.LEARNERS]
      kind = stack_step(self.config, isl.flops_per_token * tokens, rows)
      fns = stacked.build_stacked_fns(model_cfg, isl.opt_cfg, mesh, len(members), kind)
      stack = stacked.Stack(fns)
      self.rows.update({m: (stack, row) for row, m in enumerate(members)})

  def stack_stats(self) -> dict[str, Any]:
    """Waves run and how full they were, over every stack (empty when not stacked)."""
    stacks = {id(s): s for s, _ in self.rows.values()}.values()
    if not stacks:
      return {}
    waves, steps = sum(s.waves for s in stacks), sum(s.steps for s in stacks)
    slots = sum(s.waves * s.fns.size for s in stacks)
    return {
        "stacks": len(stacks),
        "step": ",".join(sorted({s.fns.kind for s in stacks})),
        "waves": waves,
        "occupancy": steps / slots if slots else 0.0,
    }

  def make_sync(self, min_checkpoint_every: int = 0) -> Synchronizer | ShardedSynchronizer:
    """A synchronizer at the initial parameters (with `outer.sync_shards` > 1, every shard
    driven as one); it asks for a checkpoint every max(`outer.sync_checkpoint_every`,
    `min_checkpoint_every`) merges of a shard (0: never)."""
    shards = max(self.owner_of) + 1
    if shards == 1:
      sync = self.make_shard(0, min_checkpoint_every)
    else:
      made = [self.make_shard(s, min_checkpoint_every) for s in range(shards)]
      sync = ShardedSynchronizer(made, self.owner_of)
    self.syncs.append(sync)
    return sync

  def make_shard(self, shard: int, min_checkpoint_every: int = 0) -> Synchronizer:
    """Synchronizer shard `shard`, over the fragments it owns (all of them with one shard)."""
    o = self.config.outer
    every = max(int(o.sync_checkpoint_every), min_checkpoint_every)
    owned = ownership.owned(self.owner_of, shard)
    return self.sync_cls(
        self.params0,
        self.frag,
        policies.from_config(self.config),
        outer_optimizer(o),
        downlink_codec=o.downlink_codec or o.codec,
        screen=outlier_screen(o),
        checkpoint_every=every,
        owned=None if len(owned) == self.frag.num_fragments else owned,
    )

  def checkpoints_on(self, faults_on: bool) -> bool:
    """Whether learners and synchronizer checkpoint: with faults, or when an interval is set."""
    o = self.config.outer
    return bool(faults_on or o.learner_checkpoint_every or o.sync_checkpoint_every)

  def recovery(self, workdir: str) -> rejoin.Recovery:
    """The checkpoints of every learner and of the synchronizer, under WORKDIR/checkpoints."""
    o = self.config.outer
    iters = [self.islands[m].data.train_iter for m in sorted(self.islands)]
    return rejoin.Recovery(
        workdir, self.make_learner, iters, o.learner_checkpoint_every, o.sync_checkpoint_every
    )


# On CPUs a vmapped step beat stepping one learner after the other in one program for the tiny
# model (25 MFLOP per learner step) and lost to it for `small` (2.7 GFLOP); BENCHMARKS.md.
CPU_VMAP_MAX_FLOPS = 2.5e8


def stacks(config: ml_collections.ConfigDict, backend: str | None = None) -> bool:
  """`outer.stack_learners`: on, off, or auto: off on CPUs, where whole runs measured faster one
  learner after the other (0.57-0.91x stacked for Decoupled runs, scripts/bench_stacked.py,
  BENCHMARKS.md "Stacked learners"), on elsewhere (accelerators, where a step is dispatch-bound)."""
  value = config.outer.stack_learners
  if value not in ("auto", "on", "off"):
    raise ValueError(f"outer.stack_learners={value!r}: expected auto, on or off")
  if value == "auto":
    return (backend or jax.default_backend()) != "cpu"
  return value == "on"


def stack_step(
    config: ml_collections.ConfigDict, flops_per_step: float = 0.0, rows: int = 1
) -> str:
  """`outer.stack_step`: 'vmap' or 'map' (inner/stacked.py). 'auto' is 'map' for a stack on one
  CPU device whose learner steps take CPU_VMAP_MAX_FLOPS or more, else 'vmap' (a loop over a
  learner axis split over devices would gather it)."""
  kind = config.outer.stack_step
  if kind == "auto":
    big = flops_per_step >= CPU_VMAP_MAX_FLOPS
    return "map" if jax.default_backend() == "cpu" and rows == 1 and big else "vmap"
  if kind not in stacked.STEPS:
    raise ValueError(f"outer.stack_step={kind!r}: expected 'auto' or one of {stacked.STEPS}")
  return kind


def stack_mesh(config: ml_collections.ConfigDict, meshes: Sequence) -> jax.sharding.Mesh:
  """The mesh of learners stacked from these island meshes: one row per learner over its own
  devices when the islands are disjoint and equal; otherwise (islands share devices) one row per
  device over gcd(M, devices) of them."""
  groups = [list(mesh.devices.flat) for mesh in meshes]
  flat = [d for g in groups for d in g]
  if len(set(flat)) == len(flat) and len({len(g) for g in groups}) == 1:
    return sharding.make_stacked_mesh(flat, len(groups), config.mesh.data, config.mesh.fsdp)
  unique = list(dict.fromkeys(flat))
  rows = math.gcd(len(groups), len(unique))
  return sharding.make_stacked_mesh(unique[:rows], rows, 1, 1)


def _cut(config, params0, islands, **classes) -> Parts:
  """Parts around these islands; `classes`: learner_cls and sync_cls, when not the defaults."""
  o = config.outer
  frag = fragments.make(o.fragment_kind, params0, o.fragments)
  schedule = fragments.Schedule(o.fragments, o.inner_steps)
  return Parts(config, islands, params0, frag, schedule, batch_sizes(config), **classes)


def _island(config, m: int, devices: Sequence, splits, init_params=None) -> island_lib.Island:
  """Learner m's island on `devices`: its own batch (`batch_sizes`) and data shard."""
  cfg_m = config.copy_and_resolve_references()
  with cfg_m.unlocked():
    cfg_m.batch_size = batch_sizes(config)[m]
  return island_lib.build_island(
      cfg_m,
      devices,
      shard_index=m,
      num_shards=config.outer.learners,
      splits=splits,
      init_params=init_params,
  )


def local_learners(
    config: ml_collections.ConfigDict,
    sync_cls: type[Synchronizer] = Synchronizer,
    stacked_learners: bool = False,
) -> Parts:
  """Every learner on its share of this process's devices (`learner_devices`), with its own
  batch and data shard: the virtual and threads runtimes; `stacked_learners` puts them on stacks
  (the virtual runtime's `outer.stack_learners`). `sync_cls` may record what the synchronizer
  does (tests)."""
  splits = data_lib.load_splits(config.data)
  islands: dict[int, island_lib.Island] = {}
  for m, devs in enumerate(learner_devices(config)):
    warm = islands[0].init_params if islands else None  # a warm start's checkpoint, read once
    islands[m] = _island(config, m, devs, splits, init_params=warm)
  params0 = fragments.flatten(jax.device_get(islands[0].init_state().params))
  parts = _cut(config, params0, islands, sync_cls=sync_cls)
  if stacked_learners:
    parts.stack()
  return parts


def one_learner(
    config: ml_collections.ConfigDict,
    m: int,
    devices: Sequence,
    learner_cls: type[Learner],
    host_value: Callable[[Any], np.ndarray],
) -> Parts:
  """Learner m alone, on `devices` (a learner process; `host_value` gathers a sharded array)."""
  if not 0 <= m < config.outer.learners:
    raise ValueError(f"learner_id={m} is outside 0..{config.outer.learners - 1} (outer.learners)")
  isl = _island(config, m, devices, data_lib.load_splits(config.data))
  params0 = {k: host_value(v) for k, v in fragments.flatten(isl.init_state().params).items()}
  return _cut(config, params0, {m: isl}, learner_cls=learner_cls)


def synchronizer_only(config: ml_collections.ConfigDict) -> Parts:
  """No learner: what the synchronizer process needs (initial parameters on one device)."""
  return _cut(config, initial_params(config), {})


@dataclasses.dataclass(frozen=True)
class Clock:
  """A learner's simulated clock in numbers (runtime/virtual.py's LearnerClock adds the jitter)."""

  step_s: float  # mean seconds per step: sim.step_s by its speed and its batch
  start_s: float
  stop_s: float  # > 0: it stops there


def clocks(config: ml_collections.ConfigDict, batches: Sequence[int]) -> list[Clock]:
  """Each learner's clock: `sim.step_s` by its speed (`sim.speeds`) and batch, its start and stop
  (`sim.start_times`, `sim.stop_times`)."""
  sim, m_count = config.sim, config.outer.learners
  speeds = parse_list(sim.speeds, m_count, float, 1.0, "sim.speeds")
  starts = parse_list(sim.start_times, m_count, float, 0.0, "sim.start_times")
  stops = parse_list(sim.get("stop_times", ""), m_count, float, 0.0, "sim.stop_times")
  if any(s <= 0 for s in speeds):
    raise ValueError(f"sim.speeds must be positive, got {sim.speeds!r}")
  return [
      Clock(sim.step_s * speeds[m] * batches[m] / config.batch_size, starts[m], stops[m])
      for m in range(m_count)
  ]


@dataclasses.dataclass(frozen=True)
class VirtualRun:
  """What the virtual runner drives: the parts, every learner holding the start, each one's
  clock, the synchronizer at the start and the fault schedule."""

  parts: Parts
  learners: list[Learner]
  clocks: list[Clock]
  sync: Synchronizer | ShardedSynchronizer
  faults: list[chaos.Fault]


def virtual_run(config: ml_collections.ConfigDict, parts: Parts | None = None) -> VirtualRun:
  """The virtual runtime's run: `parts` (default: every learner here, stacked as
  `outer.stack_learners` says) with its learners, clocks, synchronizer and faults."""
  parts = parts or local_learners(config, stacked_learners=stacks(config))
  learners = [parts.make_learner(m, holds_start=True) for m in range(config.outer.learners)]
  times = clocks(config, parts.batches)
  if config.sim.get("join_schedule", "own") == "clock":
    _join_mid_schedule(learners, times)
  return VirtualRun(parts, learners, times, parts.make_sync(), faults(config))


def _join_mid_schedule(learners: Sequence[Learner], times: Sequence[Clock]) -> None:
  """`sim.join_schedule=clock`: a learner that starts late starts its learning-rate schedule
  where one of its speed that started at t = 0 would be (its start time over its step time), as a
  learner lent to a run for a stretch joins it mid-schedule; `own`: at its first step."""
  for learner, clock in zip(learners, times):
    if clock.start_s > 0:
      at = int(clock.start_s / clock.step_s)
      opt = step_lib.restarted(learner.state.opt_state, at, fresh=False)
      learner.state = learner.state._replace(opt_state=opt)
