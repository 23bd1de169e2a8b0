"""Outer optimizers: optax transformations over path-keyed dicts of float32 outer gradients.

The outer gradient is Δ = θ_global − θ_learner (a descent direction, like a gradient), so
``optax.apply_updates(θ, updates)`` gives the new global parameters. The synchronizer runs these on
the host: pin them there with ``jax.default_device(jax.devices('cpu')[0])`` on a machine whose
default device is an accelerator. optax is the reference; `nesterov` and `sgd` also have one fast
path, `host_step` over the compiled loop of `kernels` (the same float32 operations in the same
order, so the same bits; tests/test_kernels.py holds that contract).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from diloco.outer import parallel
from diloco.outer.codecs import kernels

NAMES = ("nesterov", "sgd", "delayed_nesterov")


def _check(lr: float, momentum: float) -> None:
  if not (math.isfinite(lr) and lr > 0):
    raise ValueError(f"outer learning rate must be finite and > 0, got {lr!r}")
  if not 0 <= momentum < 1:
    raise ValueError(f"outer momentum must be in [0, 1), got {momentum!r}")


class SGD(optax.GradientTransformation):
  """`optax.sgd` with plain or Nesterov momentum, knowing its `lr` and `momentum` (0: none)."""

  lr: float
  momentum: float


def _sgd(lr: float, momentum: float) -> SGD:
  base = optax.sgd(lr, momentum=momentum or None, nesterov=momentum > 0)
  tx = SGD(base.init, base.update)
  tx.lr, tx.momentum = lr, momentum  # attributes of this instance, not tuple fields
  return tx


def nesterov(lr: float = 0.7, momentum: float = 0.9) -> SGD:
  """SGD with Nesterov momentum (DiLoCo's outer optimizer); plain SGD when momentum is 0."""
  _check(lr, momentum)
  return _sgd(lr, momentum)


def sgd(lr: float = 1.0) -> SGD:
  """Plain SGD; lr=1 makes the new global parameters the merged learner parameters."""
  _check(lr, 0.0)
  return _sgd(lr, 0.0)


def host_step(
    tx: optax.GradientTransformation,
    grads: Mapping[str, np.ndarray],
    state: Any,
    params: Mapping[str, np.ndarray],
    plus: Mapping[str, np.ndarray],
    in_place: bool = True,
) -> tuple[dict[str, np.ndarray], Any]:
  """``tx.update(grads, state, params)``'s updates + ``plus`` (new float32 arrays), and the state.

  An `SGD` runs the compiled loop, bit-identical to optax; its momentum buffers are
  updated in place when they are writable numpy arrays (the caller owns the state) and
  `in_place`, else written to new arrays (`state` is left as it was). Other transformations run
  optax op by op (never in place): pin them to the host with ``jax.default_device``.
  """
  if not isinstance(tx, SGD):
    return reference_step(tx, grads, state, params, plus)
  tensors, state = sgd_tensors(tx, grads, state, plus, in_place)
  out = {k: np.empty(np.shape(grads[k]), np.float32) for k in tensors}
  spans = [
      (k, *s) for k, (g, _, _) in tensors.items() for s in parallel.spans(g.size, kernels.CHUNK)
  ]
  step = lambda a: kernels.sgd_span(tx, *tensors[a[0]], out[a[0]].reshape(-1), a[1], a[2])
  parallel.run(step, spans)
  return out, state


def reference_step(
    tx: optax.GradientTransformation,
    grads: Mapping[str, np.ndarray],
    state: Any,
    params: Mapping[str, np.ndarray],
    plus: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], Any]:
  """The reference: optax's ``tx.update`` op by op, its updates + ``plus`` as float32 numpy."""
  updates, state = tx.update(grads, state, params)
  return {k: np.asarray(updates[k], np.float32) + plus[k] for k in plus}, state


def fractional_step(
    tx: optax.GradientTransformation,
    grads: Mapping[str, np.ndarray],
    state: Any,
    plus: Mapping[str, np.ndarray],
    share: float,
) -> tuple[dict[str, np.ndarray], Any]:
  """The share s in (0, 1] of one step of an `SGD`, plus ``plus``, and the new state.

  m ← μ^s·m + s·g and the update −lr·s·(g + μ·m) (plain SGD: −lr·s·g): at s = 1 optax's Nesterov
  step; the momentum decays by μ per full step however many fractions make it up, and takes in
  each fraction's share of the gradient (merge_clock.py: merges that hold part of a round).
  Float64 on the host, float32 out; the state's buffers are new arrays.
  """
  if not isinstance(tx, SGD):
    raise ValueError(f"a fractional outer step needs nesterov or sgd, got {type(tx).__name__}")
  if not 0 < share <= 1:
    raise ValueError(f"the share of an outer step must be in (0, 1], got {share!r}")
  paths = sorted(grads)
  leaves, treedef = jax.tree.flatten(state)
  g = {k: np.asarray(grads[k], np.float64) for k in paths}
  if not tx.momentum:
    return {k: (-tx.lr * share * g[k] + plus[k]).astype(np.float32) for k in plus}, state
  if len(leaves) != len(paths):
    raise ValueError(f"SGD state has {len(leaves)} buffers for {len(paths)} tensors")
  decay = tx.momentum**share
  traces = {k: decay * np.asarray(m, np.float64) + share * g[k] for k, m in zip(paths, leaves)}
  out = {
      k: (-tx.lr * share * (g[k] + tx.momentum * traces[k]) + plus[k]).astype(np.float32)
      for k in plus
  }
  new = [traces[k].astype(np.float32) for k in paths]
  return out, jax.tree.unflatten(treedef, new)


Trace = tuple[np.ndarray, np.ndarray] | None  # flat (old momentum, new momentum), or no momentum


def sgd_tensors(
    tx: SGD,
    grads: Mapping[str, np.ndarray],
    state: Any,
    plus: Mapping[str, np.ndarray],
    in_place: bool = True,
) -> tuple[dict[str, tuple[np.ndarray, Trace, np.ndarray]], Any]:
  """The operands of `host_step` for an `SGD`, flat float32 by path: (gradient, trace, plus); and
  the new state, whose momentum buffers `kernels.sgd_span` fills (`host_step` on `in_place`)."""
  paths = sorted(grads)
  leaves, treedef = jax.tree.flatten(state)
  if len(leaves) != (len(paths) if tx.momentum else 0):
    raise ValueError(f"SGD state has {len(leaves)} buffers for {len(paths)} tensors")
  flat = lambda x: np.asarray(x, np.float32, order="C").reshape(-1)  # the compiled loop's layout
  olds = [np.asarray(x, np.float32, order="C") for x in leaves] or [None] * len(paths)
  traces = [
      x if in_place and x.flags.writeable else np.empty(x.shape, np.float32)
      for x in olds
      if x is not None
  ] or [None] * len(paths)
  tensors = {
      k: (
          flat(grads[k]),
          None if t is None else (t_old.reshape(-1), t.reshape(-1)),
          flat(plus[k]),
      )
      for k, t_old, t in zip(paths, olds, traces)
  }
  return tensors, jax.tree.unflatten(treedef, traces if tx.momentum else [])


class DelayedNesterovState(NamedTuple):
  """Updates seen so far, the momentum, and Σ g since the last momentum update."""

  count: jax.Array  # int32 []
  momentum: Any
  accumulator: Any


def delayed_nesterov(
    lr: float, momentum: float, period: int, c: float = 0.0
) -> optax.GradientTransformation:
  """Delayed Nesterov (Liu et al. 2024, arXiv 2401.09135, Algorithm 3): one outer gradient each.

  Δ ← Δ + g. Every ``period``-th update (N): m ← β·m + Δ/N, θ ← θ − ε·((1 − c·N + c)·β·m + g/N),
  Δ ← 0. Otherwise θ ← θ − ε·(c·β·m + g/N). With c = 0 the updates in between are SGD on g/N; with
  N = 1 and c = 0 it is Nesterov SGD.
  """
  _check(lr, momentum)
  if not isinstance(period, int) or period < 1:
    raise ValueError(f"delayed Nesterov period must be a positive integer, got {period!r}")
  if not 0 <= c <= 1:
    raise ValueError(f"delayed Nesterov c must be in [0, 1], got {c!r}")
  n = period

  def init_fn(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return DelayedNesterovState(jnp.zeros([], jnp.int32), zeros, zeros)

  def update_fn(updates, state, params=None):
    del params
    count = state.count + 1
    is_momentum_step = count % n == 0
    acc = jax.tree.map(lambda a, g: a + g, state.accumulator, updates)
    mom = jax.tree.map(
        lambda m, a: jnp.where(is_momentum_step, momentum * m + a / n, m), state.momentum, acc
    )
    coef = jnp.where(is_momentum_step, (1 - c * n + c) * momentum, c * momentum)
    step = jax.tree.map(lambda m, g: (-lr * (coef * m + g / n)).astype(g.dtype), mom, updates)
    acc = jax.tree.map(lambda a: jnp.where(is_momentum_step, jnp.zeros_like(a), a), acc)
    return step, DelayedNesterovState(count, mom, acc)

  return optax.GradientTransformation(init_fn, update_fn)


def make_outer(name: str, **kwargs: Any) -> optax.GradientTransformation:
  """Outer optimizer by name: 'nesterov' | 'sgd' | 'delayed_nesterov', with its keywords."""
  makers = {"nesterov": nesterov, "sgd": sgd, "delayed_nesterov": delayed_nesterov}
  if name not in makers:
    raise ValueError(f"unknown outer optimizer {name!r}; expected one of {NAMES}")
  try:
    return makers[name](**kwargs)
  except TypeError as err:
    raise ValueError(f"bad arguments for outer optimizer {name!r}: {kwargs} ({err})") from None
