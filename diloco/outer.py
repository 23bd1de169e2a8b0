"""Outer optimizers: optax transformations over path-keyed dicts of float32 outer gradients.

The outer gradient is Δ = θ_global − θ_learner (a descent direction, like a gradient), so
``optax.apply_updates(θ, updates)`` gives the new global parameters. The synchronizer runs these on
the host: pin them there with ``jax.default_device(jax.devices('cpu')[0])`` on a machine whose
default device is an accelerator.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

NAMES = ("nesterov", "sgd", "delayed_nesterov")


def _check(lr: float, momentum: float) -> None:
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"outer learning rate must be finite and > 0, got {lr!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"outer momentum must be in [0, 1), got {momentum!r}")


def nesterov(lr: float = 0.7, momentum: float = 0.9) -> optax.GradientTransformation:
    """SGD with Nesterov momentum (DiLoCo's outer optimizer); plain SGD when momentum is 0."""
    _check(lr, momentum)
    return optax.sgd(lr, momentum=momentum or None, nesterov=momentum > 0)


def sgd(lr: float = 1.0) -> optax.GradientTransformation:
    """Plain SGD; lr=1 makes the new global parameters the merged learner parameters."""
    _check(lr, 0.0)
    return optax.sgd(lr)


class DelayedNesterovState(NamedTuple):
    """Updates seen so far, the momentum, and Σ g since the last momentum update."""

    count: jax.Array  # int32 []
    momentum: Any
    accumulator: Any


def delayed_nesterov(lr: float, momentum: float, period: int,
                     c: float = 0.0) -> optax.GradientTransformation:
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
        mom = jax.tree.map(lambda m, a: jnp.where(is_momentum_step, momentum * m + a / n, m),
                           state.momentum, acc)
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
