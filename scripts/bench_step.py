"""Times the training step against a large matmul of the same dtype on the same devices.

  python scripts/bench_step.py --model=small --batch=32 --seq=128
  python scripts/bench_step.py --model=90m,180m --dtype=bfloat16 --batch=16 --seq=1024  # GPU

Prints achieved FLOP/s of the step (model FLOPs per token x tokens / step time) and of an N x N x N
`jnp.dot` whose rows are split over the island's devices, then the ratio: `step_vs_matmul=0.xx`,
and the step's MFU against the devices' peak (plan/peak.py: a TPU's or GPU's dense bf16 figure, a
CPU's cached float32 matmul): `mfu=0.xx`.
With --attention=both it times the XLA implementations (and cuDNN's on a GPU) and reports the
ratio of the fastest. With several models, one `step_vs_matmul[model]=` line each and last the
smallest of them.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from jax.sharding import NamedSharding, PartitionSpec as P

from diloco import timing
from diloco.config import variants
from diloco.inner import sharding, step as step_lib
from diloco.models import transformer
from diloco.plan import peak

_MODEL = flags.DEFINE_list("model", ["small"], f"Model presets, of {list(variants.MODEL_SIZES)}.")
_BATCH = flags.DEFINE_integer("batch", 32, "Global batch (sequences).")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps (after 3 warm-up steps).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_ATTENTION = flags.DEFINE_enum(
    "attention",
    "both",
    ["einsum", "dot_product_attention", "cudnn", "both"],
    "Attention implementation(s) to time.",
)
_REMAT = flags.DEFINE_enum("remat", "none", ["none", "block", "dots"], "Rematerialisation.")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 0, "Matmul size N (0: 2048 on CPU, 8192 else).")


def step_flops_per_s(model_cfg, mesh) -> float:
  opt = step_lib.OptimizerConfig(warmup_steps=0, decay_steps=0)
  fns = step_lib.build_step_fns(model_cfg, opt, mesh)
  state = [fns.init(jax.random.key(0))]
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 256, (_BATCH.value, _SEQ.value + 1)).astype(np.int32)
  batch = step_lib.put_batch({"inputs_BxL": tokens[:, :-1], "targets_BxL": tokens[:, 1:]}, mesh)

  def one():
    state[0], m = fns.train(state[0], batch)
    jax.block_until_ready(m["loss"])

  seconds = timing.median_seconds(one, _STEPS.value, warmup=3)
  flops = transformer.flops_per_token(model_cfg, _SEQ.value) * _BATCH.value * _SEQ.value
  print(
      f"step[{model_cfg.attention}]: {seconds * 1e3:.2f} ms, {flops / seconds / 1e9:.2f} GFLOP/s,"
      f" {_BATCH.value * _SEQ.value / seconds:,.0f} tokens/s"
  )
  return flops / seconds


def matmul_flops_per_s(mesh, dtype) -> float:
  n = _MATMUL_N.value or (2048 if jax.default_backend() == "cpu" else 8192)
  rows = NamedSharding(mesh, P(tuple(a for a in sharding.BATCH_AXES if a in mesh.axis_names), None))
  a = jax.device_put(jnp.ones((n, n), dtype), rows)
  b = jax.device_put(jnp.ones((n, n), dtype), NamedSharding(mesh, P()))
  dot = jax.jit(jnp.dot, out_shardings=rows)
  seconds = timing.median_seconds(lambda: jax.block_until_ready(dot(a, b)), 10, warmup=3)
  print(
      f"matmul {n}x{n}x{n} {jnp.dtype(dtype).name}: {seconds * 1e3:.2f} ms,"
      f" {2 * n**3 / seconds / 1e9:.2f} GFLOP/s"
  )
  return 2 * n**3 / seconds


def measure(name: str, mesh) -> float:
  """The step's FLOP/s of one model preset (the fastest attention asked for)."""
  base = {
      **variants.model_config(name).to_dict(),
      "max_len": max(_SEQ.value, 64),
      "dtype": _DTYPE.value,
      "remat": _REMAT.value,
  }
  kinds = [_ATTENTION.value]
  if _ATTENTION.value == "both":
    kinds = ["einsum", "dot_product_attention"] + (
        ["cudnn"] if jax.default_backend() == "gpu" else []
    )
  print(
      f"model={name} batch={_BATCH.value} seq={_SEQ.value} dtype={_DTYPE.value} remat={_REMAT.value}"
  )
  rates = {
      k: step_flops_per_s(transformer.ModelConfig(**{**base, "attention": k}), mesh) for k in kinds
  }
  best = max(rates, key=rates.get)
  if len(rates) > 1:
    print(f"fastest attention: {best} ({rates[best] / min(rates.values()):.2f}x the slowest)")
  return rates[best]


def main(argv):
  del argv
  devices = jax.devices()
  mesh = sharding.make_island_mesh(devices, data=-1, fsdp=1)
  print(f"devices: {len(devices)} x {devices[0].device_kind} ({jax.default_backend()})")
  matmul = matmul_flops_per_s(mesh, jnp.dtype(_DTYPE.value))
  chips = 1 if devices[0].platform == "cpu" else len(devices)  # a CPU's devices share its cores
  device_peak = peak.device_peak(devices[0])
  print(f"peak: {device_peak.flops_per_s * chips / 1e12:.3f} TFLOP/s ({device_peak.source})")
  rates = {name: measure(name, mesh) for name in _MODEL.value}
  mfu = {name: r / (device_peak.flops_per_s * chips) for name, r in rates.items()}
  if len(rates) > 1:
    for name, r in rates.items():
      print(f"step_vs_matmul[{name}]={r / matmul:.2f} mfu[{name}]={mfu[name]:.3f}")
  print(f"step_vs_matmul={min(rates.values()) / matmul:.2f}")
  print(f"mfu={min(mfu.values()):.3f}")


if __name__ == "__main__":
  app.run(main)
