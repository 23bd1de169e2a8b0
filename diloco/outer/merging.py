"""Merging the outer gradients of several learners: token weights, weighted mean, RDA.

Host-side numpy, float32 accumulation. Tensors are processed in chunks of ``CHUNK`` values so that
the accumulator and one temporary stay in cache: each learner's delta is read once per pass and the
result written once, with no temporaries the size of a tensor. Equal weights sum first and scale
once (w·Σx rather than Σ w·x: fewer operations, different rounding).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from diloco.outer import fragments, parallel

RULES = ("mean", "rda")
CHUNK = 1 << 17  # values per chunk: 512 KiB of float32

# Coefficients outside [2^-100, 2^100] are applied as two float32 factors (no over/underflow).
_SAFE = 2.0**100
# Below this float32 sum of squares, small elements' squares may have underflowed: use float64.
_SUMSQ_TINY = 2.0**-100


def token_weights(tokens: Sequence[float], steps: Sequence[float]) -> np.ndarray:
  """w_m = c_tokens·(c_tokens/c_steps), "quantity times quality"; float64 [M].

  A learner with zero steps (nothing done since it last received the fragment) gets weight 0; zero
  steps with tokens > 0 is inconsistent and raises ValueError.
  """
  t = np.asarray(tokens, np.float64)
  s = np.asarray(steps, np.float64)
  if t.ndim != 1 or t.shape != s.shape:
    raise ValueError(f"tokens and steps must be 1-D of equal length, got {t.shape} and {s.shape}")
  if not (np.isfinite(t).all() and np.isfinite(s).all()) or (t < 0).any() or (s < 0).any():
    raise ValueError(f"tokens and steps must be finite and >= 0, got {t.tolist()} and {s.tolist()}")
  if ((s == 0) & (t > 0)).any():
    raise ValueError(
        f"a learner reports tokens but zero steps: tokens={t.tolist()}, steps={s.tolist()}"
    )
  return np.divide(t * t, s, out=np.zeros_like(t), where=s > 0)


def equal_weights(n: int) -> np.ndarray:
  """1/n for each of n learners; float64 [n]."""
  if n < 1:
    raise ValueError(f"need at least one learner, got n={n}")
  return np.full(n, 1.0 / n)


def _normalised(weights: Sequence[float], n: int) -> np.ndarray:
  w = np.asarray(weights, np.float64)
  if w.shape != (n,):
    raise ValueError(f"need {n} weights (one per delta), got shape {w.shape}")
  if not np.isfinite(w).all() or (w < 0).any():
    raise ValueError(f"weights must be finite and >= 0, got {w.tolist()}")
  total = w.sum()
  if total <= 0:
    raise ValueError("all weights are zero: nothing to merge")
  return w / total


def _flat_f32(deltas: Sequence[np.ndarray]) -> tuple[tuple[int, ...], list[np.ndarray]]:
  """Common shape and flat float32 views (copies only for other dtypes or non-contiguous)."""
  if not deltas:
    raise ValueError("need at least one delta to merge")
  shape = tuple(np.shape(deltas[0]))
  flats = []
  for m, d in enumerate(deltas):
    if tuple(np.shape(d)) != shape:
      raise ValueError(f"delta {m} has shape {tuple(np.shape(d))}, delta 0 has {shape}")
    flats.append(np.ascontiguousarray(d, dtype=np.float32).reshape(-1))
  return shape, flats


def _factors(c: float) -> tuple[np.float32, ...]:
  """``c`` as one float32, or two whose product is c when c alone would over/underflow."""
  if c == 0 or 1 / _SAFE <= abs(c) <= _SAFE:
    return (np.float32(c),)
  root = math.sqrt(abs(c))
  return (np.float32(math.copysign(root, c)), np.float32(root))


def _chunk_dots(x_N: np.ndarray, start: int, stop: int) -> list[float]:
  """x·x of each chunk of x[start:stop] (start a multiple of CHUNK), in float32, in order."""
  with np.errstate(over="ignore", under="ignore"):  # both are caught by `_sumsq`
    return [
        float(np.dot(c, c))
        for c in (x_N[c0 : min(c0 + CHUNK, stop)] for c0 in range(start, stop, CHUNK))
    ]


def _sumsq(x_N: np.ndarray) -> float:
  """Σx² with float32 chunk dots summed in float64, in chunk order (the dots computed in spans
  over `parallel`'s threads: the same sum for any count); float64 throughout when that is
  unsafe."""
  total = 0.0
  for dots in parallel.run(lambda s: _chunk_dots(x_N, *s), _spans(x_N.size)):
    for d in dots:
      total += d
  if not math.isfinite(total) or total < _SUMSQ_TINY:
    x64 = x_N.astype(np.float64)
    total = float(np.dot(x64, x64))
  return total


def _scaled(x_N: np.ndarray, c: float) -> tuple[np.ndarray, float]:
  """(x, c), or (x·2^k, c·2^-k) when c is beyond what two float32 factors can hold.

  A delta of subnormal size beside a huge one has a coefficient ref/‖x‖ near 2^270; scaling x by a
  power of two first is exact (x is tiny, so x·2^k is a normal float32) and leaves c in range.
  """
  if not math.isfinite(c) or abs(c) <= _SAFE * _SAFE:  # NaN: the caller finds its delta
    return x_N, c
  k = int(math.floor(math.log2(abs(c)))) - 100
  return np.ldexp(x_N, k).astype(np.float32), math.ldexp(c, -k)


def _combine(
    terms: list[tuple[np.ndarray, float]],
    out_N: np.ndarray,
    start: int = 0,
    stop: int | None = None,
) -> bool:
  """out = Σ c·x over ``terms``, chunk by chunk, in float32; whether all of out is finite.

  Equal coefficients (a plain mean) are applied once to the sum, c·Σx, half the operations of
  Σ c·x; a chunk where that sum overflows is done again as Σ c·x. Only out[start:stop] is
  written (start a multiple of CHUNK: the chunks, hence the results, are those of the whole).
  """
  stop = out_N.size if stop is None else stop
  n = min(CHUNK, stop - start)
  tmp, finite = np.empty(n, np.float32), np.empty(n, bool)
  plans = [(x, _factors(c)) for x, c in terms]
  factored_once = len(plans) > 1 and all(f == plans[0][1] for _, f in plans)
  all_finite = True
  for c0 in range(start, stop, CHUNK):
    acc = out_N[c0 : min(c0 + CHUNK, stop)]
    ok = finite[: acc.size]
    if factored_once:
      with np.errstate(over="ignore"):  # redone below
        np.add(plans[0][0][c0 : c0 + CHUNK], plans[1][0][c0 : c0 + CHUNK], out=acc)
        for x, _ in plans[2:]:
          acc += x[c0 : c0 + CHUNK]
        for f in plans[0][1]:
          acc *= f
      if np.isfinite(acc, out=ok).all():
        continue
    _products(plans, c0, acc, tmp[: acc.size])
    all_finite = all_finite and bool(np.isfinite(acc, out=ok).all())
  return all_finite


def _products(
    plans: list[tuple[np.ndarray, tuple[np.float32, ...]]],
    c0: int,
    acc: np.ndarray,
    tmp: np.ndarray,
) -> None:
  """acc = Σ c·x over one chunk (starting at c0), each product rounded, then summed in order."""
  for i, (x, factors) in enumerate(plans):
    dst = acc if i == 0 else tmp
    np.multiply(x[c0 : c0 + acc.size], factors[0], out=dst)
    for f in factors[1:]:
      dst *= f
    if i:
      acc += tmp


def weighted_mean(deltas: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
  """Σ w_m Δ_m / Σ w_m, float32, shape of the deltas; zero-weight deltas are skipped."""
  shape, flats = _flat_f32(deltas)
  w = _normalised(weights, len(flats))
  out = np.empty(math.prod(shape), np.float32)
  _combine([(x, wm) for x, wm in zip(flats, w) if wm > 0], out)
  return out.reshape(shape)


def rda(deltas: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
  """Radial-directional averaging of one tensor; float32, shape of the deltas.

  norm = Σ w‖Δ‖ / Σ w; direction = normalize(Σ w·Δ/‖Δ‖) with normalize(0) = 0; the result is
  norm·direction.
  A zero delta adds 0 to the norm's numerator (its weight stays in the denominator) and nothing to
  the direction. Directions are summed as w·(‖Δ‖max/‖Δ‖)·Δ, the same direction at the scale of the
  largest delta, so tiny deltas do not overflow float32.
  """
  shape, flats = _flat_f32(deltas)
  return _rda(flats, _normalised(weights, len(flats)))[0].reshape(shape)


def _rda(flats: list[np.ndarray], w: np.ndarray) -> tuple[np.ndarray, list[float]]:
  """Flat RDA of flat float32 deltas with normalised weights, and the deltas' norms (0 for
  zero weights; NaN or Inf exactly when a delta holds NaN or Inf)."""
  norms = [math.sqrt(_sumsq(x)) if wm > 0 else 0.0 for x, wm in zip(flats, w)]
  target = float(np.dot(w, norms))
  out = np.zeros(flats[0].size, np.float32)
  if target == 0:
    return out, norms
  ref = max(norms)
  terms = [_scaled(x, wm * (ref / n)) for x, wm, n in zip(flats, w, norms) if wm > 0 and n > 0]
  parallel.run(lambda s: _combine(terms, out, *s), _spans(out.size))
  length = math.sqrt(_sumsq(out))
  if length == 0:  # the unit directions cancel exactly
    return np.zeros_like(out), norms
  for f in _factors(target / length):
    out *= f
  return out, norms


def merge_fragment(
    deltas: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    rule: str = "rda",
    is_embedding: Callable[[str], bool] = fragments.is_embedding,
) -> dict[str, np.ndarray]:
  """Merges path-keyed outer gradients leaf by leaf; embedding leaves always by weighted mean."""
  return merge_checked(deltas, weights, rule, is_embedding)[0]


def merge_checked(
    deltas: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    rule: str = "rda",
    is_embedding: Callable[[str], bool] = fragments.is_embedding,
) -> tuple[dict[str, np.ndarray], list[int]]:
  """`merge_fragment`, and the indices of the deltas holding a NaN or Inf (sorted).

  Found without a pass of their own over every delta: a weighted mean is finite only if every
  delta with a positive weight is (NaN and Inf propagate through products with positive weights
  and through sums), and RDA's norms are finite exactly when their deltas are; only deltas under
  suspicion (a non-finite mean, a non-finite norm, or a zero weight) are checked value by value.
  When the list is not empty the merged values are meaningless: merge the others again.
  """
  if rule not in RULES:
    raise ValueError(f"unknown merge rule {rule!r}; expected one of {RULES}")
  if not deltas:
    raise ValueError("need at least one learner's deltas to merge")
  paths = sorted(deltas[0])
  for m, d in enumerate(deltas[1:], start=1):
    if sorted(d) != paths:
      missing, extra = sorted(set(paths) - set(d)), sorted(set(d) - set(paths))
      raise ValueError(
          f"learner {m}'s fragment differs from learner 0's: missing "
          f"{missing[:5]}, extra {extra[:5]}"
      )
  # Normalised twice, as merging each leaf on its own (`weighted_mean`, `rda`) does.
  w = _normalised(_normalised(weights, len(deltas)), len(deltas))
  suspects = {m for m, wm in enumerate(w) if wm == 0}
  merged = {}
  for group in _groups(paths, deltas):
    merged.update(_merge_group(group, deltas, w, rule, is_embedding, suspects))
  merged = {path: merged[path] for path in paths}
  bad = [m for m in sorted(suspects) if not all(all_finite(x) for x in deltas[m].values())]
  return merged, bad


DECODE_BUDGET = 1 << 28  # bytes of decoded leaves a merge holds at once (beyond one leaf)


def _groups(paths: list[str], deltas: Sequence[Mapping[str, np.ndarray]]) -> list[list[str]]:
  """Consecutive paths whose decoded copies (`compression.Decoded.copy_bytes`; none for fp32
  views and arrays) fit DECODE_BUDGET together; a leaf alone when it is larger."""
  groups, held = [[]], 0
  for path in paths:
    cost = sum(getattr(d, "copy_bytes", lambda k: 0)(path) for d in deltas)
    if groups[-1] and held + cost > DECODE_BUDGET:
      groups.append([])
      held = 0
    groups[-1].append(path)
    held += cost
  return groups


def _merge_group(
    group: list[str],
    deltas: Sequence[Mapping[str, np.ndarray]],
    w: np.ndarray,
    rule: str,
    is_embedding: Callable[[str], bool],
    suspects: set[int],
) -> dict[str, np.ndarray]:
  """The merged leaves of `group` (adding to `suspects` the deltas that may hold NaN or Inf).

  The uploads' leaves are read (decoded) over `parallel`'s threads; the tasks are a mean's spans
  of chunks and each RDA leaf whole (whose phases, norms, combination and length, are spread over
  spans in turn when it runs alone: `parallel.run` runs inline in a worker): the same bits as one
  thread."""
  read = [(path, m) for path in group for m in range(len(deltas))]
  leaves = dict(zip(read, parallel.run(lambda t: deltas[t[1]][t[0]], read)))
  shapes, tasks = {}, []
  for path in group:
    shapes[path], flats = _flat_f32([leaves.pop((path, m)) for m in range(len(deltas))])
    if rule == "mean" or is_embedding(path):
      terms = [(x, wm) for x, wm in zip(flats, w) if wm > 0]
      out = np.empty(math.prod(shapes[path]), np.float32)
      tasks += [(path, out, functools.partial(_combine, terms, out, *s)) for s in _spans(out.size)]
    else:
      tasks.append((path, None, functools.partial(_rda, flats, w)))
  merged = {}
  for (path, out, _), result in zip(tasks, parallel.run(lambda t: t[2](), tasks)):
    if out is None:
      out, norms = result
      suspects.update(m for m, n in enumerate(norms) if not math.isfinite(n))
    elif not result:
      suspects.update(m for m, wm in enumerate(w) if wm > 0)
    merged[path] = out.reshape(shapes[path])
  return merged


def _spans(size: int) -> list[tuple[int, int]]:
  return parallel.spans(size, CHUNK)


def all_finite(x: np.ndarray) -> bool:
  """Whether every value of x is finite, in chunks (no temporary the size of x)."""
  x_N = np.asarray(x).reshape(-1)
  return all(np.isfinite(x_N[c0 : c0 + CHUNK]).all() for c0 in range(0, x_N.size, CHUNK))


def staleness_damped(merged: dict, weights: np.ndarray, staleness: list[int]) -> dict:
  """`merged` times the weighted mean of 1/(1 + staleness) (unchanged when all are fresh)."""
  if not any(staleness):
    return merged
  factor = np.float32(np.dot(weights / weights.sum(), 1.0 / (1.0 + np.array(staleness, float))))
  return {k: v * factor for k, v in merged.items()}
