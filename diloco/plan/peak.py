"""The peak FLOP/s of the devices a run uses, and its model FLOPs utilisation (MFU).

MFU = tokens/s x model FLOPs per token / (devices x one device's peak), with the model's FLOPs
(`transformer.flops_per_token`: 6 per weight plus causal attention), never the compiled program's.
A device's peak is its dense bf16 figure: TPU chips from `tpu.CHIPS` (the Cloud TPU pages), NVIDIA
GPUs from their data sheets (`GPU_PEAKS`). A CPU has no published figure: its peak is a float32
matmul measured once on the machine (all its cores, as one XLA CPU device uses them) and cached
under $XDG_CACHE_HOME/diloco (or ~/.cache/diloco), keyed by processor, core count and jax
version; the summary says which (`peak_source`).
"""

import dataclasses
import json
import os
import platform
import time

from diloco.plan import tpu

# Dense bf16 tensor-core peaks per GPU (NVIDIA data sheets, SXM parts; sparsity excluded).
GPU_PEAKS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L4": 121e12}
TPU_KINDS = (("v6 lite", "v6e"), ("v6e", "v6e"), ("v5 lite", "v5litepod"), ("v5e", "v5litepod"))
TPU_KINDS += (("v5p", "v5p"), ("v5", "v5p"), ("v4", "v4"))
MATMUL_N = 2048  # the CPU measurement: a 2048^3 float32 matmul, best of 5 after a warmup


@dataclasses.dataclass(frozen=True)
class Peak:
  """One device's peak FLOP/s and where the figure comes from."""

  flops_per_s: float
  source: str


def device_peak(device) -> Peak:
  """The peak of one JAX device (a CPU's is measured on first use, then read from the cache)."""
  kind = str(getattr(device, "device_kind", "")).lower()
  if device.platform == "tpu":
    for name, generation in TPU_KINDS:
      if name in kind:
        chip = tpu.CHIPS[generation]
        return Peak(chip.peak_bf16_flops, f"{generation} dense bf16 ({chip.source})")
  if device.platform == "gpu":
    for name, flops in GPU_PEAKS.items():
      if name.lower() in kind:
        return Peak(flops, f"{name} dense bf16 (NVIDIA data sheet)")
  if device.platform == "cpu":
    return cpu_peak()
  raise ValueError(f"no peak FLOP/s known for {device.platform} device {kind!r}")


CACHE_NAME = "diloco/peak_flops.json"  # under $XDG_CACHE_HOME, else ~/.cache


def _cache_path(name: str = CACHE_NAME) -> str:
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, *name.split("/"))


def cached_figure(name: str, key: str, measure) -> float:
  """A figure of this machine under `key` in the cache file `name`: `measure()` once, then read."""
  path = _cache_path(name)
  cached = {}
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        cached = json.load(f)
    except (OSError, ValueError):
      cached = {}
  if key not in cached:
    cached[key] = measure()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(cached, f, indent=1)
    os.replace(tmp, path)
  return float(cached[key])


def machine_key() -> str:
  import jax

  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return f"{cpu} / {os.cpu_count()} cores / jax {jax.__version__}"


def cpu_peak() -> Peak:
  """This machine's float32 matmul FLOP/s: measured once, then read from the cache."""
  flops = cached_figure(CACHE_NAME, machine_key(), measure_cpu_matmul)
  return Peak(flops, f"cpu float32 matmul measured on this machine ({CACHE_NAME})")


def measure_cpu_matmul(n: int = MATMUL_N, reps: int = 5) -> float:
  """FLOP/s of the fastest of `reps` n x n x n float32 matmuls on the first CPU device."""
  import jax
  import jax.numpy as jnp

  device = jax.devices("cpu")[0]
  a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, a))
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(dot(a, a))
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


class Meter:
  """tokens/s per device and MFU of runs over `devices`, their peak found once (a CPU's cache is
  read once, not at every logged row). A CPU run's devices share one host: its peak counts once."""

  def __init__(self, devices):
    devices = list(devices)
    self.chips = 1 if devices[0].platform == "cpu" else len(devices)
    try:
      self.peak, self.reason = device_peak(devices[0]), ""
    except ValueError as e:  # an accelerator without a figure: the rate, and why no MFU
      self.peak, self.reason = None, str(e)

  def __call__(self, tokens_per_s: float, flops_per_token: float) -> dict:
    per_chip = tokens_per_s / self.chips
    if self.peak is None:
      return {"tokens_per_s_per_chip": per_chip, "mfu": None, "peak_source": self.reason}
    return {
        "tokens_per_s_per_chip": per_chip,
        "mfu": tokens_per_s * flops_per_token / (self.chips * self.peak.flops_per_s),
        "peak_flops_per_s": self.peak.flops_per_s * self.chips,
        "peak_source": self.peak.source,
    }


def utilisation(tokens_per_s: float, flops_per_token: float, devices) -> dict:
  """tokens/s per device and MFU of one run over `devices` (`Meter`)."""
  return Meter(devices)(tokens_per_s, flops_per_token)
