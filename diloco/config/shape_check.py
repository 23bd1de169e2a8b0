"""What a config's model shapes imply, from `jax.eval_shape` (nothing allocated or trained):
seq_len within max_len, fragments within the parameter tensors, synchronizer shards within the
fragments; and the model's parameter count."""

import functools
import math

import ml_collections

Problems = list[tuple[str, str]]  # (key, why)


def problems(c) -> Problems:
  """What the model's shapes imply: seq_len within max_len, fragments within the tensors."""
  try:
    return _problems(c)
  except (TypeError, ValueError, KeyError) as e:  # keys already named as bad above
    return [("model", f"cannot derive the model's shapes: {e}")]


def _problems(c) -> Problems:
  out = []
  image = c.data.source in ("digits", "npz_glob")
  if not image and c.seq_len > c.model.max_len:
    out.append(("seq_len", f"exceeds model.max_len={c.model.max_len}: raise it or shorten seq_len"))
  try:
    shapes = _param_shapes(_model_key(c))
  except (ValueError, TypeError) as e:
    return out + [("model", str(e))]
  if c.mode != "dp":
    from diloco.outer import fragments
    from diloco.outer.sync import ownership

    try:
      fragments.make(c.outer.fragment_kind, shapes, c.outer.fragments)
    except ValueError as e:
      n = len(fragments.flatten(shapes))
      out.append(("outer.fragments", f"the model has {n} parameter tensors ({e}); lower it"))
    try:
      ownership.check(c.outer.get("sync_shards", 1), c.outer.fragments)
    except ValueError as e:
      out.append(("outer.sync_shards", str(e)))
  return out


def _model_key(c) -> tuple:
  fields = {k: v for k, v in c.model.to_dict().items() if k != "size"}
  return tuple(sorted(fields.items())), c.data.source in ("digits", "npz_glob")


@functools.lru_cache(maxsize=32)
def _param_shapes(key: tuple) -> dict:
  """The parameter shapes of a model (jax.eval_shape: nothing allocated), by config."""
  import jax
  from flax import nnx

  from diloco.models import transformer, vit
  from diloco.outer import fragments

  fields, image = dict(key[0]), key[1]
  cfg = vit.VitConfig(**fields) if image else transformer.ModelConfig(**fields)
  model = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
  return fragments.flatten(jax.tree.map(lambda x: x, nnx.to_pure_dict(nnx.state(model))))


def param_count(c: ml_collections.ConfigDict) -> int:
  """The model's parameters (from its shapes; nothing allocated)."""
  return sum(math.prod(x.shape) for x in _param_shapes(_model_key(c)).values())
