"""Text from a decoder's parameters: temperature and top-k sampling, full recompute, no KV cache.

Every new token runs the whole model over a fixed window of `max_len` tokens (the context so far,
padded at the end; the last `max_len` tokens once it is longer), so one jitted program serves every
step and every prompt. Causal attention keeps the padding from reaching the position sampled.
That costs O(max_len) per token instead of a KV cache's O(1) new positions: fine for looking at a
small model's text, not for serving one.
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@functools.partial(jax.jit, static_argnames=("graphdef", "top_k"))
def _next_token(
    graphdef: nnx.GraphDef,
    params: Any,
    window_1xL: jax.Array,
    length: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_k: int,
) -> jax.Array:
  """The token after the first `length` of the window: argmax at temperature 0, else sampled
  from the softmax of logits / temperature over the `top_k` likeliest (0: all)."""
  logits_V = nnx.merge(graphdef, params)(window_1xL)[0, length - 1]
  if top_k:
    kth = jax.lax.top_k(logits_V, min(top_k, logits_V.shape[-1]))[0][-1]
    logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
  sampled = jax.random.categorical(key, logits_V / jnp.maximum(temperature, 1e-6))
  return jnp.where(temperature > 0, sampled, jnp.argmax(logits_V)).astype(jnp.int32)


def generate(
    graphdef: nnx.GraphDef,
    params: Any,
    prompt: np.ndarray,
    tokens: int,
    max_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    stop: Callable[[list[int]], bool] | None = None,
) -> np.ndarray:
  """`tokens` new token ids after `prompt` (1-D, not empty); the same for the same seed. With
  `stop`, fewer: generation ends after the first new token for which stop(new ids) is true."""
  if len(prompt) == 0:
    raise ValueError("the prompt is empty: give at least one token to continue")
  if tokens < 0 or temperature < 0 or top_k < 0:
    raise ValueError(f"need tokens, temperature, top_k >= 0; got {tokens}, {temperature}, {top_k}")
  context = [int(t) for t in prompt]
  params, key = jax.device_put(params), jax.random.key(seed)
  out = []
  for i in range(tokens):
    window = context[-max_len:]
    window_1xL = np.zeros((1, max_len), np.int32)
    window_1xL[0, : len(window)] = window
    token = _next_token(
        graphdef,
        params,
        window_1xL,
        np.int32(len(window)),
        jax.random.fold_in(key, i),
        np.float32(temperature),
        top_k,
    )
    context.append(int(token))
    out.append(context[-1])
    if stop is not None and stop(out):
      break
  return np.asarray(out, np.int32)
