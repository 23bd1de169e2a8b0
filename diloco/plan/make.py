"""`make_plan`: one learner of a config on one TPU slice, compiled and measured before launch.

Everything a user can get wrong is checked before libtpu is loaded or anything is compiled: the
config (the same resolution and checks as a run), the accelerator type, the mesh against the
slice's chips and the parameters against the mesh (on an abstract mesh). A plan whose peak does
not fit the chip's HBM is refused by `refusal`, naming the keys that change it.
"""

import dataclasses

import ml_collections
from flax import nnx
from jax.sharding import AbstractMesh

from diloco.config import build, checks
from diloco.inner import island as island_lib, sharding
from diloco.plan import devices as devices_lib, programs, report, sync_load, tpu

BYTE_VOCAB = 256
SYNC_CORES = 16  # cores of a synchronizer shard's host (its merge threads: outer/parallel.py)
IMAGE_SOURCES = ("digits", "npz_glob")


class DoesNotFit(checks.ConfigError):
  """A plan whose peak memory per chip exceeds the chip's HBM: the numbers and the keys."""

  def __init__(self, plan: report.Plan, config: ml_collections.ConfigDict):
    super().__init__(_fit_problems(plan, config), config)
    c, worst = plan.chip, max(plan.programs, key=lambda p: p.peak_bytes)
    compiler = f"; the TPU compiler: {worst.refused}" if worst.refused else ""
    self.args = (
        f"{plan.pod.name}: the learner needs {report.gib(plan.peak_bytes)} GiB per chip at its "
        f"peak ({worst.name}{compiler}), a {c.generation} chip has "
        f"{c.hbm_bytes / tpu.GiB:.1f} GiB of HBM. Keys that lower it:\n"
        + "\n".join(f"  {k}={_value(config, k)!r}: {why}" for k, why in self.problems),
    )

  def __str__(self) -> str:
    return self.args[0]


def _value(config, key: str):
  for part in key.split("."):
    config = config[part]
  return config


def _fit_problems(plan: report.Plan, config) -> checks.Problems:
  chips, m = plan.pod.chips, config.model
  out = []
  if config.mesh.fsdp != -1 and config.mesh.fsdp < chips:
    out.append(
        ("mesh.fsdp", f"shard parameters and optimizer state over more of the {chips} chips")
    )
  if m.remat != "block":
    out.append(("model.remat", "'block' keeps only each block's input for the backward pass"))
  if m.dtype == "float32":
    out.append(("model.dtype", "'bfloat16' computes in half the bytes (weights stay float32)"))
  out.append(("batch_size", "fewer sequences per step (activations grow with it)"))
  if config.data.tokenizer != "byte":
    out.append(
        ("data.sp_vocab_size", "a smaller vocabulary (the embedding and logits grow with it)")
    )
  out.append(("seq_len", "shorter sequences (activations grow with it, attention faster)"))
  return out


def vocabulary(config: ml_collections.ConfigDict, vocab_size: int | None) -> int:
  """The vocabulary a run of `config` would have, without reading its corpus: `vocab_size` when
  given, else the tokenizer's (bytes: 256; sentencepiece: data.sp_vocab_size)."""
  if config.data.source in IMAGE_SOURCES:
    raise checks.ConfigError(
        [("data.source", "plans cover decoder language models, not the ViT of image data")], config
    )
  if vocab_size is not None:
    if vocab_size < 2:
      raise ValueError(f"--vocab_size={vocab_size}: a vocabulary has at least 2 tokens")
    return vocab_size
  return BYTE_VOCAB if config.data.tokenizer == "byte" else config.data.sp_vocab_size


def slice_shape(config, pod: tpu.PodType) -> tuple[int, ...]:
  """deploy.tpu.topology when it names this slice's chips, else the type's default shape."""
  given = config.deploy.tpu.get("topology", "") if "deploy" in config else ""
  if given:
    return tuple(int(d) for d in tpu.check_topology(pod, given).split("x"))
  return tpu.default_topology(pod)


def check_mesh(config, pod: tpu.PodType, vocab_size: int) -> None:
  """The island's mesh tiles the slice and every parameter divides along its sharded axes."""
  mesh = config.mesh
  expert, tensor = mesh.get("expert", 1), mesh.get("tensor", 1)
  try:
    shape, names = sharding.island_shape(pod.chips, mesh.data, mesh.fsdp, expert, tensor)
  except ValueError as e:
    raise checks.ConfigError(
        [
            (
                "mesh",
                f"mesh.data={mesh.data}, mesh.fsdp={mesh.fsdp}, mesh.expert={expert} do not tile "
                f"the {pod.chips} chips of {pod.name} ({e}); -1 takes what is left",
            )
        ],
        config,
    ) from e
  model_cfg = island_lib.model_config(config, programs.Vocabulary(vocab_size), backend="tpu")
  params = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0)))))
  try:
    sharding.tree_shardings(params, AbstractMesh(shape, names))
  except ValueError as e:
    raise checks.ConfigError([("mesh", str(e))], config) from e


def make_plan(
    config: ml_collections.ConfigDict,
    accelerator_type: str,
    *,
    vocab_size: int | None = None,
    mfu: float = report.DEFAULT_MFU,
    key: str = "--topology",
    sync_cores: int = SYNC_CORES,
    disk_gbps: float = sync_load.DISK_BYTES_PER_S / 1e9,
) -> report.Plan:
  """Compiles one learner of `config` for a slice of `accelerator_type` and measures it, and
  sizes the synchronizer of M such learners (`sync_cores` per shard host, its disk's GB/s).

  ConfigError (or ValueError naming `key`) before anything is loaded or compiled when the input
  is wrong; devices.LibtpuMissing when libtpu is not installed.
  """
  if not 0 < mfu <= 1:
    raise ValueError(f"--mfu={mfu}: a fraction of the chip's peak, in (0, 1]")
  if sync_cores < 1 or not disk_gbps > 0:
    raise ValueError(f"--sync_cores={sync_cores}, --disk_gbps={disk_gbps}: expected >= 1 and > 0")
  config = checks.prepare(config)
  pod = tpu.parse(accelerator_type, key)
  tpu.chip(pod)
  shape = slice_shape(config, pod)
  vocab = vocabulary(config, vocab_size)
  check_mesh(config, pod, vocab)
  batch = config.batch_size if config.mode == "dp" else max(build.batch_sizes(config))
  devices = devices_lib.slice_devices(pod, shape)
  learner = programs.build(config, devices, vocab, batch)
  compiled = [programs.train(learner), programs.evaluate(learner)]
  fragment = frag_bytes = None
  if learner.frag is not None:
    fragment = programs.largest_fragment(learner)
    frag_bytes = programs.fragment_bytes_per_chip(learner, fragment)
    compiled.append(programs.receive(learner, fragment))
  m = max(config.outer.learners, 1)
  quorum = config.outer.quorum if 0 < config.outer.quorum <= m else m
  plan = report.Plan(
      pod, shape, learner, tuple(compiled), fragment, frag_bytes or 0, mfu, m, quorum
  )
  if learner.frag is None:
    return plan
  return dataclasses.replace(plan, sync=sync_load.load(plan, config, sync_cores, disk_gbps * 1e9))


class SyncCannotKeepUp(checks.ConfigError):
  """A plan whose synchronizer shards cannot merge what its learners upload: the numbers, and
  the keys that change the load."""

  def __init__(self, plan: report.Plan, config: ml_collections.ConfigDict):
    load, o = plan.sync, config.outer
    problems = [
        (
            "outer.sync_shards",
            f"{load.shards_needed} shards of {load.cores_per_shard} cores keep up",
        ),
        ("outer.inner_steps", f"H={o.inner_steps}: a longer period sends each fragment less often"),
        ("outer.fragments", f"P={o.fragments}: uploads per second grow with P / H"),
        ("outer.codec", f"{o.codec!r}: the uploads' codec sets the decode work per byte merged"),
    ]
    super().__init__(problems, config)
    self.args = (
        f"the synchronizer of M={load.learners} learners cannot keep up: "
        f"{load.uploads_per_s:.2f} uploads/s of {load.fragment_bytes / 1e9:.3f} GB need "
        f"{load.merge_busy:.2f} core-seconds of merging per second ({load.cores_needed} cores "
        f"with headroom x{sync_load.HEADROOM:g}, {load.shards_needed} shards of "
        f"{load.cores_per_shard} cores), outer.sync_shards={load.shards}. Keys that change it:\n"
        + "\n".join(f"  {k}={_value(config, k)!r}: {why}" for k, why in problems),
    )

  def __str__(self) -> str:
    return self.args[0]


def refusal(
    plan: report.Plan, config: ml_collections.ConfigDict
) -> DoesNotFit | SyncCannotKeepUp | None:
  """DoesNotFit when the plan's peak exceeds the chip's HBM, SyncCannotKeepUp when its
  synchronizer shards cannot keep up, else None."""
  if not plan.fits:
    return DoesNotFit(plan, config)
  if plan.sync is not None and not plan.sync.keeps_up:
    return SyncCannotKeepUp(plan, config)
  return None


def summary(plan: report.Plan, config: ml_collections.ConfigDict) -> str:
  """The whole report, with the bandwidth and goodput of M such learners; `config` as
  `make_plan` left it (resolved in place)."""
  return report.format_plan(
      plan, config, report.bandwidth_rows(plan, config.outer), report.goodput_rows(plan)
  )
