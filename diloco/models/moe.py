"""A sparse mixture-of-experts MLP: a learned router, top-k routing under a capacity, and the
load-balancing and router z auxiliary losses.

The tokens of a step are routed in groups of G = `group_size` (the whole batch when it has fewer,
or G does not divide it), each group on its own: that bounds the dispatch tensors at
T x E x C for C of one group, as GShard's groups do. The T tokens of a group each get router logits
z_TxE = x W_r over E experts and probabilities p = softmax(z). A token sends itself to its top-k
experts; its gates are the chosen probabilities, renormalised over the k when k = 2 (GShard; with
k = 1 the gate is the probability itself, as in Switch). Every expert takes at most
C = ceil(capacity_factor * k * T / E) tokens. Slots are handed out in priority order: every
token's first choice before any second choice, earlier tokens first within a choice; an
assignment past its expert's C is dropped (the block's residual carries that token on). Outputs:

  y_t = sum over kept assignments (t, e) of gate * expert_e(x_t)
  load_balance = E * sum_e f_e P_e  (f_e: share of tokens whose first choice is e, P_e: mean p_e;
                 1 when both are uniform; Fedus et al. 2021)
  router_z = mean_t (logsumexp_e z_te)^2  (Zoph et al. 2022)
  dropped = dropped assignments / (k T)
  load_E = assignments expert e kept / (k T / E)  (1 for every expert when routing is even; 0 for
           an expert that took no token: its weights get no gradient from this step)

Parameters: router [D, E] (replicated), wi [E, D, 2, F] (swiglu) or [E, D, F], wo [E, F, D], the
expert dimension sharded over the island mesh's 'expert' axis when it has one.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx


class Routing(NamedTuple):
  dispatch_TxExC: jax.Array  # 1 where token t takes slot c of expert e
  combine_TxExC: jax.Array  # the gate there
  load_balance: jax.Array
  router_z: jax.Array
  dropped: jax.Array  # fraction of the k*T assignments past capacity
  load_E: jax.Array  # kept assignments per expert over an even share k*T/E


def capacity(tokens: int, experts: int, k: int, factor: float) -> int:
  return max(1, math.ceil(factor * k * tokens / experts))


def route(logits_TxE: jax.Array, k: int, cap: int) -> Routing:
  """Top-k routing of T tokens, given in priority order, under capacity `cap` (module doc)."""
  t, e = logits_TxE.shape
  probs_TxE = jax.nn.softmax(logits_TxE, axis=-1)
  top_p_TxK, top_e_TxK = jax.lax.top_k(probs_TxE, k)
  gates_TxK = top_p_TxK if k == 1 else top_p_TxK / jnp.sum(top_p_TxK, -1, keepdims=True)
  # Assignment n = token * k + choice, in priority order; its slot is how many came before it.
  choice_NxE = jax.nn.one_hot(top_e_TxK.reshape(t * k), e, dtype=jnp.int32)
  position_N = jnp.sum((jnp.cumsum(choice_NxE, axis=0) - 1) * choice_NxE, axis=-1)
  kept_N = position_N < cap
  slot_NxC = jax.nn.one_hot(jnp.where(kept_N, position_N, cap), cap, dtype=jnp.float32)
  dispatch_TxKxExC = (choice_NxE[:, :, None] * slot_NxC[:, None, :]).reshape(t, k, e, cap)
  combine_TxExC = jnp.einsum("tkec,tk->tec", dispatch_TxKxExC, gates_TxK.astype(jnp.float32))
  first_TxE = jax.nn.one_hot(top_e_TxK[:, 0], e, dtype=jnp.float32)
  load_balance = e * jnp.sum(jnp.mean(first_TxE, 0) * jnp.mean(probs_TxE, 0))
  router_z = jnp.mean(jax.nn.logsumexp(logits_TxE, axis=-1) ** 2)
  dropped = 1.0 - jnp.mean(kept_N.astype(jnp.float32))
  load_E = jnp.sum(choice_NxE * kept_N[:, None], axis=0).astype(jnp.float32) * e / (k * t)
  dispatch_TxExC = jnp.sum(dispatch_TxKxExC, 1)
  return Routing(dispatch_TxExC, combine_TxExC, load_balance, router_z, dropped, load_E)


class MoeMlp(nnx.Module):
  """E expert MLPs (SwiGLU or GELU, width F each) behind a top-k router."""

  def __init__(self, cfg, rngs: nnx.Rngs):
    self.gated, self.k, self.factor = cfg.mlp == "swiglu", cfg.top_k, cfg.capacity_factor
    self.group = cfg.group_size
    d, f, e = cfg.d_model, cfg.expert_d_ff, cfg.num_experts
    normal = lambda shape, fan_in: nnx.Param(
        jax.random.normal(rngs.params(), shape, jnp.float32) * fan_in**-0.5
    )
    self.router = normal((d, e), d)
    self.wi = normal((e, d, 2, f) if self.gated else (e, d, f), d)
    self.wo = normal((e, f, d), f)

  def __call__(self, x_BxLxD: jax.Array) -> tuple[jax.Array, Routing]:
    b, l, d = x_BxLxD.shape
    dtype = x_BxLxD.dtype
    t = b * l
    g = self.group if 0 < self.group < t and t % self.group == 0 else t
    # Position-major (the priority order), then cut into groups of g tokens.
    x_NxGxD = jnp.swapaxes(x_BxLxD, 0, 1).reshape(t // g, g, d)
    logits_NxGxE = jnp.einsum("ngd,de->nge", x_NxGxD.astype(jnp.float32), self.router[...])
    e = logits_NxGxE.shape[-1]
    cap = capacity(g, e, self.k, self.factor)
    r = jax.vmap(lambda z: route(z, self.k, cap))(logits_NxGxE)
    in_NxExCxD = jnp.einsum("ngec,ngd->necd", r.dispatch_TxExC.astype(dtype), x_NxGxD)
    if self.gated:
      h_NxExCx2xF = jnp.einsum("necd,edhf->nechf", in_NxExCxD, self.wi[...].astype(dtype))
      h_NxExCxF = jax.nn.silu(h_NxExCx2xF[..., 0, :]) * h_NxExCx2xF[..., 1, :]
    else:
      h_NxExCxF = jax.nn.gelu(jnp.einsum("necd,edf->necf", in_NxExCxD, self.wi[...].astype(dtype)))
    out_NxExCxD = jnp.einsum("necf,efd->necd", h_NxExCxF, self.wo[...].astype(dtype))
    y_NxGxD = jnp.einsum("ngec,necd->ngd", r.combine_TxExC.astype(dtype), out_NxExCxD)
    stats = Routing(
        r.dispatch_TxExC,
        r.combine_TxExC,
        *(jnp.mean(x) for x in (r.load_balance, r.router_z, r.dropped)),
        jnp.mean(r.load_E, axis=0),  # groups are equal: the step's load is their mean
    )
    return jnp.swapaxes(y_NxGxD.reshape(l, b, d), 0, 1), stats
