"""A plan's figures from its compiled programs: memory per chip against HBM, the roofline step,
throughput at an MFU, and what M such learners need (bandwidth) and get (goodput).

The roofline step time is max(FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth) of the compiled
train step on one chip (FLOPs: the compiler's count or the model's, whichever is larger): a lower
bound that ignores collectives over the interconnect and any stall; the step at an MFU is the model's FLOPs (6N plus attention, `transformer.flops_per_token`)
at that fraction of the chip's peak, which is what a run's throughput is usually quoted as. The
predicted step is the slower of the two, since no MFU beats the roofline; tokens/s and the
bandwidth model use it.
"""

import dataclasses
from typing import Any

from diloco.models import transformer
from diloco.plan import programs, sync_load, tpu
from diloco.sim import bandwidth, calibration, goodput
from diloco.sim.cluster import Cluster
from diloco.sim.timeline import Workload

# PaLM's 540B model trained at 46.2% model FLOPs utilisation on 6,144 TPU v4 chips (Chowdhery et
# al. 2022, arXiv 2204.02311, Table 3): a large, well-tuned decoder on TPUs. Smaller models and
# untuned configs reach less; pass --mfu for your own figure.
DEFAULT_MFU = 0.462
MFU_SOURCE = "PaLM 540B on TPU v4, Chowdhery et al. 2022, Table 3"
GOODPUT_DAYS, GOODPUT_SEEDS = 7.0, 5


@dataclasses.dataclass(frozen=True)
class Plan:
  """What one learner of a config does on one slice, and M of them."""

  pod: tpu.PodType
  shape: tuple[int, ...]
  learner: programs.Learner
  programs: tuple[programs.Compiled, ...]  # train, eval, then receive when there are fragments
  fragment: int | None  # the largest fragment, whose receive was compiled
  fragment_bytes: int  # its bytes per chip
  mfu: float
  learners: int  # M, for the bandwidth and goodput figures
  quorum: int  # K of the goodput figures' decoupled policy
  sync: Any = None  # plan/sync_load.SyncLoad: the synchronizer M learners need (with fragments)

  @property
  def chip(self) -> tpu.Chip:
    return tpu.chip(self.pod)

  @property
  def train(self) -> programs.Compiled:
    return self.programs[0]

  @property
  def peak_bytes(self) -> int:
    return max(p.peak_bytes for p in self.programs)

  @property
  def fits(self) -> bool:
    return self.peak_bytes <= self.chip.hbm_bytes and not any(p.refused for p in self.programs)

  @property
  def model_flops_per_chip(self) -> float:
    """Model FLOPs of one train step on one chip (6N + attention, per token, times tokens)."""
    per_token = transformer.flops_per_token(self.learner.model_cfg, self.learner.seq_len)
    return per_token * self.learner.tokens_per_step / self.pod.chips

  @property
  def roofline_s(self) -> float:
    return max(self.compute_s, self.memory_s)

  @property
  def compute_s(self) -> float:
    """The step's FLOPs at the chip's peak: the compiler's count, or the model's where that is
    larger (under FSDP the compiler's count per chip fell to 0.77 of the model's: BENCHMARKS)."""
    return max(self.train.flops, self.model_flops_per_chip) / self.chip.peak_bf16_flops

  @property
  def memory_s(self) -> float:
    return self.train.hbm_bytes / self.chip.hbm_bytes_per_s

  @property
  def step_s(self) -> float:
    """The train step at `mfu` of the chip's peak."""
    return self.model_flops_per_chip / (self.mfu * self.chip.peak_bf16_flops)

  @property
  def predicted_step_s(self) -> float:
    """The step at `mfu`, or the roofline where that is slower (no MFU beats the roofline)."""
    return max(self.step_s, self.roofline_s)

  @property
  def tokens_per_s_per_chip(self) -> float:
    return self.learner.tokens_per_step / self.predicted_step_s / self.pod.chips

  @property
  def compile_s(self) -> float:
    return sum(p.compile_s for p in self.programs)


def bandwidth_rows(plan: Plan, outer) -> list[tuple[str, dict[str, float]]]:
  """Gbit/s per learner each method needs between M learners of the predicted step, per target
  utilisation; every method with the config's H, P, tau and codec (data-parallel: bf16)."""
  cfg = plan.learner.model_cfg
  work = Workload(plan.learner.param_count, cfg.num_layers, plan.predicted_step_s)
  m = plan.learners
  rows = []
  for name in bandwidth.METHODS:
    method = bandwidth.make_method(
        name,
        learners=max(m, 2) if name == "data_parallel" else m,
        inner_steps=outer.inner_steps,
        fragments=min(max(outer.fragments, 1), cfg.num_layers),
        overlap=outer.overlap,
        codec=outer.codec,
        diloco_codec=outer.codec,
    )
    rows.append((name, bandwidth.needed(work, method)))
  return rows


def goodput_rows(plan: Plan) -> list[goodput.Result]:
  """Goodput of M learners of this slice (one job of M slices for data-parallel) under chip
  failures: the calibrated simulator (diloco/sim/calibration.py), a host the failure unit."""
  params = dict(calibration.CALIBRATED)
  cluster = Cluster(
      chips=plan.learners * plan.pod.chips,
      mtbi_years=calibration.PUBLISHED_MTBI_YEARS,
      unit_chips=plan.pod.chips_per_host,
      return_time_s=params["return_time_s"],
      speed_std=params["speed_std"],
      days=GOODPUT_DAYS,
  )
  timing = {
      k: params[k] for k in ("restart_s", "checkpoint_interval_s", "downscale_s", "upscale_s")
  }
  named = [
      goodput.make_policy("dp", **timing),
      goodput.make_policy("elastic_dp", **timing),
      goodput.make_policy("decoupled", learners=plan.learners, quorum=plan.quorum, **timing),
  ]
  return goodput.simulate_many(cluster, named, range(GOODPUT_SEEDS))


def gib(n: float) -> str:
  return f"{n / tpu.GiB:.2f}"


def memory_lines(plan: Plan) -> list[str]:
  """Per chip, in GiB: each program's arguments, outputs, aliased, temporaries, code and peak."""
  head = f"  {'per chip, GiB':<22}{'args':>8}{'outputs':>9}{'aliased':>9}{'temps':>9}"
  lines = [head + f"{'code':>7}{'peak':>9}{'of HBM':>8}"]
  for p in plan.programs:
    if p.refused:
      lines.append(f"  {p.name:<22}refused by the TPU compiler: {p.refused}")
      continue
    lines.append(
        f"  {p.name:<22}{gib(p.argument_bytes):>8}{gib(p.output_bytes):>9}{gib(p.alias_bytes):>9}"
        f"{gib(p.temp_bytes):>9}{gib(p.code_bytes):>7}{gib(p.peak_bytes):>9}"
        f"{p.peak_bytes / plan.chip.hbm_bytes:>8.1%}"
    )
  return lines


def format_plan(plan: Plan, config, bandwidth_table, goodput_table) -> str:
  """The report: one block of text."""
  c, cfg, lrn = plan.chip, plan.learner.model_cfg, plan.learner
  mesh = dict(lrn.fns.mesh.shape)
  out = [
      f"slice: {plan.pod.name}, {plan.pod.chips} chips on {plan.pod.hosts} host(s), topology "
      f"{'x'.join(map(str, plan.shape))}; a {c.generation} chip: {c.hbm_bytes / tpu.GiB:.1f} GiB "
      f"HBM, {c.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, {c.hbm_bytes_per_s / 1e9:.0f} GB/s "
      f"({c.source})",
      f"model: {lrn.param_count:,} parameters (d_model {cfg.d_model}, {cfg.num_layers} layers, "
      f"{cfg.num_heads} heads, {cfg.mlp} {cfg.d_ff}, vocabulary {cfg.vocab_size:,}), "
      f"{cfg.dtype} compute, remat={cfg.remat}, attention={cfg.attention}",
      f"island: mesh {' x '.join(f'{k}={v}' for k, v in mesh.items())}; mode={config.mode}; "
      f"{lrn.batch} x {lrn.seq_len} = {lrn.tokens_per_step:,} tokens per step; eval batch "
      f"{lrn.eval_batch}",
      *memory_lines(plan),
  ]
  if plan.fragment is not None:
    out.append(
        f"  fragment {plan.fragment} (the largest of {len(lrn.frag.paths)}): "
        f"{plan.fragment_bytes / 2**20:.1f} MiB per chip read to the host per upload (no HBM "
        "beyond the parameters); a receive's program above"
    )
  verdict = "fits" if plan.fits else "DOES NOT FIT"
  bound = plan.roofline_s > plan.step_s
  out += [
      f"peak: {gib(plan.peak_bytes)} GiB per chip of {c.hbm_bytes / tpu.GiB:.1f}: {verdict}",
      f"train step per chip: {plan.train.flops / 1e12:.3f} TFLOP compiled, model "
      f"{plan.model_flops_per_chip / 1e12:.3f} TFLOP (6N + attention; compiled/model "
      f"{plan.train.flops / plan.model_flops_per_chip:.2f}), {plan.train.hbm_bytes / 1e9:.1f} GB "
      "of HBM traffic",
      f"roofline step: {1e3 * plan.roofline_s:.2f} ms (compute {1e3 * plan.compute_s:.2f} ms, "
      f"HBM {1e3 * plan.memory_s:.2f} ms; collectives not counted)",
      f"at MFU {plan.mfu:g}{' (' + MFU_SOURCE + ')' if plan.mfu == DEFAULT_MFU else ''}: step "
      f"{1e3 * plan.step_s:.2f} ms"
      + (
          f", faster than the roofline allows: predicted {1e3 * plan.roofline_s:.2f} ms"
          if bound
          else ""
      )
      + f"; {plan.tokens_per_s_per_chip:,.0f} tokens/s per chip, "
      f"{plan.tokens_per_s_per_chip * plan.pod.chips:,.0f} per slice"
      + (
          " (float32 compute: the peak is bf16's, float32 matmuls reach a fraction of it)"
          if cfg.dtype == "float32"
          else ""
      ),
      f"bandwidth per learner between M={plan.learners} such learners, Gbit/s to reach "
      f"{'/'.join(f'{100 * t:g}' for t in bandwidth.TARGETS)}% compute utilisation (H="
      f"{config.outer.inner_steps}, P={config.outer.fragments}, tau={config.outer.overlap}, "
      f"codec {config.outer.codec}; data-parallel bf16):",
  ]
  for name, need in bandwidth_table:
    out.append(f"  {name:<14}" + " ".join(f"{v:>10.3g}" for v in need.values()))
  out.append(
      f"goodput of M={plan.learners} learners of this slice ({plan.learners * plan.pod.chips} "
      f"chips, a host fails once per {calibration.PUBLISHED_MTBI_YEARS:g} chip-year, "
      f"{GOODPUT_DAYS:g} days, {GOODPUT_SEEDS} seeds; decoupled K={plan.quorum}):"
  )
  for r in goodput_table:
    out.append(f"  {r.policy:<14} {100 * r.goodput:6.2f}%  ({r.failures:.1f} failures)")
  if plan.sync is not None:
    out += sync_load.lines(plan.sync)
  times = ", ".join(f"{p.name} {p.compile_s:.1f}" for p in plan.programs)
  out.append(f"compiled for the TPU in {plan.compile_s:.1f} s ({times})")
  return "\n".join(out)


def figures(plan: Plan) -> dict:
  """The plan's numbers as a JSON-ready dict (scripts/plan_table.py reads these)."""
  cfg = plan.learner.model_cfg
  return {
      "topology": plan.pod.name,
      "chips": plan.pod.chips,
      "params": plan.learner.param_count,
      "dtype": cfg.dtype,
      "remat": cfg.remat,
      "mesh": {k: int(v) for k, v in plan.learner.fns.mesh.shape.items()},
      "batch": plan.learner.batch,
      "seq_len": plan.learner.seq_len,
      "programs": [dataclasses.asdict(p) for p in plan.programs],
      "peak_bytes": plan.peak_bytes,
      "hbm_bytes": plan.chip.hbm_bytes,
      "fits": plan.fits,
      "train_flops": plan.train.flops,
      "model_flops": plan.model_flops_per_chip,
      "roofline_s": plan.roofline_s,
      "mfu": plan.mfu,
      "step_s": plan.step_s,
      "predicted_step_s": plan.predicted_step_s,
      "tokens_per_s_per_chip": plan.tokens_per_s_per_chip,
      "compile_s": plan.compile_s,
      "synchronizer": None if plan.sync is None else sync_load.figures(plan.sync),
  }
