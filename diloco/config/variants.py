"""Helpers for config files: parsing 'key=value,flag' arguments and model size presets."""

from typing import Any

import ml_collections

from diloco.config import domains, keys

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
    # From 35m up (LARGE_SIZES) a size also sets bfloat16 compute, remat=block and scanned
    # layers, and the island's FSDP axis spans its devices (mesh.fsdp=-1): what a TPU slice needs.
    "35m": dict(d_model=512, num_layers=6, num_heads=8, d_ff=2048, mlp="gelu", max_len=2048),
    "90m": dict(d_model=768, num_layers=9, num_heads=12, d_ff=3072, mlp="gelu", max_len=2048),
    "180m": dict(d_model=1024, num_layers=12, num_heads=16, d_ff=4096, mlp="gelu", max_len=2048),
    # Llama-style decoders for TPU slices (RMSNorm, rotary, SwiGLU, untied embeddings): 1b is
    # 1.26B parameters with a 32,000 vocabulary (TinyLlama's shape, all heads for keys and values,
    # 16 heads of 128), 8b is Llama 3 8B's shape (8.03B with its 128,256 vocabulary: grouped-query
    # attention with 8 key/value heads). The vocabulary is the tokenizer's.
    "1b": dict(
        d_model=2048,
        num_layers=22,
        num_heads=16,
        d_ff=5632,
        max_len=8192,
        tied_embeddings=False,
    ),
    "8b": dict(
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        d_ff=14336,
        max_len=32768,
        tied_embeddings=False,
        rope_base=500_000.0,
    ),
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


LARGE_SIZES = ("35m", "90m", "180m", "1b", "8b")
LARGE_DEFAULTS = dict(dtype="bfloat16", remat="block", scan_layers=True)
for _size in LARGE_SIZES:
  MODEL_SIZES[_size] = {**LARGE_DEFAULTS, **MODEL_SIZES[_size]}


# ViT shapes of configs/digits.py (d, blocks, heads, MLP; vit_moe: 4 experts, top-2).
VIT_SIZES: dict[str, dict[str, Any]] = {
    "vit_tiny": dict(d_model=32, num_layers=2, num_heads=2, d_ff=64),
    "vit_small": dict(d_model=64, num_layers=2, num_heads=4, d_ff=128),
    "vit_moe": dict(d_model=64, num_layers=2, num_heads=4, d_ff=128, num_experts=4, expert_d_ff=64),
}
# The model keys a size sets (the others keep their defaults whatever the size).
SIZE_KEYS = (
    "d_model",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "d_ff",
    "max_len",
    "mlp",
    "num_experts",
    "expert_d_ff",
    "moe_every",
    "tied_embeddings",
    "rope_base",
    "dtype",
    "remat",
    "scan_layers",
)


def size_fields(size: str) -> dict[str, Any]:
  """The model keys that `size` sets (empty for an unknown size: the checks name it); a ViT size
  leaves max_len alone."""
  if size not in MODEL_SIZES and size not in VIT_SIZES:
    return {}
  base = {k: v for k, v in MODEL_BASE.items() if k in SIZE_KEYS}
  return {**base, **MODEL_SIZES.get(size, {}), **VIT_SIZES.get(size, {})}


def apply(c: ml_collections.ConfigDict, arg: str | None, aliases: dict[str, str]) -> None:
  """Sets the keys named by 'a=1,b=x,flag' through `aliases` (variant -> dotted config key),
  typed like the key's value, as explicitly as a --config flag would; bare words set True.

  Unknown variants fail naming the known ones, so a typo is caught like a typo in an override.
  """
  for name, raw in _tokens(arg, aliases):
    *parents, leaf = aliases[name].split(".")
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = _convert(name, raw, node[leaf])


def drop(arg: str | None, names) -> str:
  """`arg` ('a=1,b=x') without the variants in `names`: a sweep file's own variants (which points
  to run), which its get_config does not take."""
  return ",".join(t for t in (arg or "").split(",") if t.strip().partition("=")[0] not in names)


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses 'a=1,b=x,flag' into a ConfigDict typed like `defaults`; bare words set True.

  Unknown keys fail, so a typo in a variant is caught as early as a typo in an override.
  """
  out = ml_collections.ConfigDict(dict(defaults))
  for name, raw in _tokens(arg, defaults):
    out[name] = _convert(name, raw, defaults[name])
  return out


def _tokens(arg: str | None, known) -> list[tuple[str, str | None]]:
  """'a=1,b' -> [('a', '1'), ('b', None)]; an unknown name fails naming the known ones."""
  out = []
  for token in (arg or "").split(","):
    name, eq, raw = token.strip().partition("=")
    if not name:
      continue
    if name not in known:
      raise ValueError(f"unknown config variant {name!r}; known: {sorted(known)}")
    out.append((name, raw if eq else None))
  return out


def _convert(key: str, raw: str | None, default: Any) -> Any:
  """`raw` typed like `default`; a bare word (None) is True for a boolean."""
  if raw is None:
    if not isinstance(default, bool):
      raise ValueError(f"variant {key!r} needs a value ({key}=...)")
    return True
  if isinstance(default, bool):
    if raw.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"variant {key}={raw!r} is not a boolean")
    return raw.lower() in ("true", "1")
  try:
    return type(default)(raw)
  except ValueError as e:
    raise ValueError(f"variant {key}={raw!r} is not a {type(default).__name__}") from e


MODEL_MEANINGS = {
    "vocab_size": "vocabulary (the tokenizer's size replaces it at build time; classes for images)",
    "d_model": "width of the residual stream",
    "num_layers": "transformer blocks",
    "num_heads": "attention heads (d_model / num_heads must be even: rotary embeddings)",
    "num_kv_heads": "key/value heads (grouped-query attention; must divide num_heads); 0: num_heads",
    "d_ff": "width of the MLP",
    "max_len": "longest sequence the model takes (seq_len must not exceed it)",
    "mlp": "swiglu | gelu",
    "tied_embeddings": "the output layer reuses the token embedding",
    "attention": "auto (einsum on GPUs, dot_product_attention elsewhere: the faster measured) | "
    "einsum (ours) | dot_product_attention (XLA's) | cudnn (GPU fused kernel)",
    "rope_base": "base of the rotary position embedding's frequencies",
    "dtype": "compute dtype (float32 | bfloat16 | float16); weights and optimizer stay float32",
    "remat": "recompute in the backward pass: none | block | dots",
    "scan_layers": "run the blocks as one scan over parameters stored stacked (layers/...; compile"
    " time nearly flat in depth); fragments see them per block, a loop's checkpoint converts;"
    " needs moe_every=1",
    "num_experts": "mixture of experts: experts per sparse block (0: a dense model)",
    "top_k": "experts each token is routed to",
    "capacity_factor": "tokens an expert takes per group, as a multiple of an even share",
    "expert_d_ff": "width of each expert's MLP (0: d_ff)",
    "moe_every": "blocks moe_every-1, 2*moe_every-1, ... are sparse",
    "group_size": "tokens routed together (the capacity is per group)",
    "aux_loss_weight": "weight of the load-balancing loss in the training objective",
    "z_loss_weight": "weight of the router z-loss",
    "qk_norm": "RMSNorm (learned scale) of each head's queries and keys before rotary and the dot"
    " product (recipe=charles2025: True)",
    "z_loss": "weight of the output z-loss mean(logsumexp(logits)^2) in a decoder's training"
    " objective (the train step's metric z_loss); not in evaluation; not the router's z_loss_weight"
    " (recipe=charles2025: 1e-4)",
}
# Model keys a recipe sets, by recipe: filled like a size's keys, unless given.
MODEL_RECIPES = {"qk_norm": {"charles2025": True}, "z_loss": {"charles2025": 1e-4}}
MODEL_DOMAINS = {"z_loss": domains.nonneg("0: no output z-loss")}


def model_section(
    size: str, runlocal_size: str, compare_size: str = "", **extra: tuple[Any, str]
) -> ml_collections.ConfigDict:
  """The `model` section: `size` picks the shape keys (SIZE_KEYS) unless they are given; under
  `runlocal` the size is `runlocal_size` (mode=compare: `compare_size`, when given) unless
  `model.size` is given. `extra`: more keys."""
  fields = {**MODEL_BASE, **size_fields(size)}
  by_mode = {"compare": compare_size} if compare_size else {}
  spec: dict[str, tuple[Any, str]] = {
      "size": (keys.Auto(size, runlocal=runlocal_size, **by_mode), _size_meaning())
  }
  for name, value in fields.items():
    auto = name in SIZE_KEYS or name in MODEL_RECIPES
    value = keys.Auto(value, recipes=MODEL_RECIPES.get(name)) if auto else value
    domain = (MODEL_DOMAINS[name],) if name in MODEL_DOMAINS else ()
    spec[name] = (value, MODEL_MEANINGS[name], *domain)
  return keys.section("model", **spec, **extra)


def _size_meaning() -> str:
  return (
      "a shape preset: "
      + " | ".join([*MODEL_SIZES, *VIT_SIZES])
      + " (sets "
      + ", ".join(SIZE_KEYS)
      + " unless given)"
  )


def model_config(size: str) -> ml_collections.ConfigDict:
  """The plain keys of a decoder of `size` (tests and benchmarks build models from it)."""
  if size not in MODEL_SIZES:
    raise ValueError(f"unknown model size {size!r}; known: {sorted(MODEL_SIZES)}")
  return ml_collections.ConfigDict({**MODEL_BASE, **MODEL_SIZES[size]})


MODEL_BASE: dict[str, Any] = dict(
    vocab_size=256,
    num_kv_heads=0,
    mlp="swiglu",
    tied_embeddings=True,
    attention="auto",
    rope_base=10_000.0,
    dtype="float32",
    remat="none",
    scan_layers=False,
    num_experts=0,
    top_k=2,
    capacity_factor=1.25,
    expert_d_ff=0,
    moe_every=1,
    group_size=1024,
    aux_loss_weight=0.01,
    z_loss_weight=0.001,
    qk_norm=False,
    z_loss=0.0,
)
