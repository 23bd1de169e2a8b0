"""Helpers for config files: parsing 'key=value,flag' arguments and model size presets."""

from typing import Any

import ml_collections

MODEL_SIZES: dict[str, dict[str, Any]] = {
    # ~29k parameters: unit tests.
    "tiny": dict(d_model=32, num_layers=2, num_heads=2, d_ff=64, max_len=64),
    # ~0.8M parameters: the default demo on a 2-core CPU.
    "small": dict(d_model=128, num_layers=4, num_heads=4, d_ff=384, max_len=512),
    # ~27M parameters: real runs on accelerators.
    "base": dict(d_model=512, num_layers=8, num_heads=8, d_ff=1536, max_len=2048),
    # The DiLoCo scaling-laws shapes (Charles et al. 2025, Table 3: layers, heads, d, MLP), with a
    # plain GELU MLP of that width; the names count a 32k vocabulary's embedding (35.7M, 88.9M,
    # 184.6M); with bytes they have 19.0M, 63.9M and 151.3M parameters.
    "35m": dict(d_model=512, num_layers=6, num_heads=8, d_ff=2048, mlp="gelu", max_len=2048),
    "90m": dict(d_model=768, num_layers=9, num_heads=12, d_ff=3072, mlp="gelu", max_len=2048),
    "180m": dict(d_model=1024, num_layers=12, num_heads=16, d_ff=4096, mlp="gelu", max_len=2048),
    # Mixtures of experts with the active parameters of tiny and small: top-2 of experts half as
    # wide as the dense MLP. moe_tiny: both blocks sparse, 4 experts; moe_small: blocks 1 and 3
    # sparse (moe_every=2), 8 experts.
    "moe_tiny": dict(
        d_model=32, num_layers=2, num_heads=2, d_ff=64, max_len=64, num_experts=4, expert_d_ff=32
    ),
    "moe_small": dict(
        d_model=128,
        num_layers=4,
        num_heads=4,
        d_ff=384,
        max_len=512,
        num_experts=8,
        expert_d_ff=192,
        moe_every=2,
    ),
}


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses 'a=1,b=x,flag' into a ConfigDict typed like `defaults`; bare words set True.

  Unknown keys fail, so a typo in a variant is caught as early as a typo in an override.
  """
  out = ml_collections.ConfigDict(dict(defaults))
  if not arg:
    return out
  for token in arg.split(","):
    token = token.strip()
    if not token:
      continue
    key, _, raw = token.partition("=")
    if key not in defaults:
      raise ValueError(f"unknown config variant {key!r}; known: {sorted(defaults)}")
    default = defaults[key]
    if not _:
      if not isinstance(default, bool):
        raise ValueError(f"variant {key!r} needs a value ({key}=...)")
      out[key] = True
      continue
    out[key] = _convert(key, raw, default)
  return out


def _convert(key: str, raw: str, default: Any) -> Any:
  if isinstance(default, bool):
    if raw.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"variant {key}={raw!r} is not a boolean")
    return raw.lower() in ("true", "1")
  try:
    return type(default)(raw)
  except ValueError as e:
    raise ValueError(f"variant {key}={raw!r} is not a {type(default).__name__}") from e


def model_config(size: str) -> ml_collections.ConfigDict:
  if size not in MODEL_SIZES:
    raise ValueError(f"unknown model size {size!r}; known: {sorted(MODEL_SIZES)}")
  base = dict(
      vocab_size=256,
      mlp="swiglu",
      tied_embeddings=True,
      attention="dot_product_attention",
      rope_base=10_000.0,
      dtype="float32",
      remat="none",
      num_experts=0,
      top_k=2,
      capacity_factor=1.25,
      expert_d_ff=0,
      moe_every=1,
      group_size=1024,
      aux_loss_weight=0.01,
      z_loss_weight=0.001,
  )
  return ml_collections.ConfigDict({**base, **MODEL_SIZES[size]})
