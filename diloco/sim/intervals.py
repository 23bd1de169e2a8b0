"""Vectorised helpers on sorted time intervals: pauses, unions, covered length, quorum time."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def absorb_pauses(t_E: np.ndarray, dur_E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Pauses [start, end) caused by sorted events t_E, each asking for a pause of dur_E.

  An event that finds the job running starts a pause of its own duration; an event that arrives
  during a pause is handled by that pause at no extra cost (the reconfiguration that ends the pause
  takes the state of the cluster at its end). Pauses never overlap.
  """
  n = t_E.size
  if n == 0:
    return np.zeros(0), np.zeros(0)
  ends_E = t_E + dur_E
  # The first event at or after the end of a pause started by event i starts the next pause.
  nxt = np.maximum(np.searchsorted(t_E, ends_E, side="left"), np.arange(1, n + 1)).tolist()
  starts, i = [], 0
  while i < n:  # one step per pause, not per chip or per event
    starts.append(i)
    i = nxt[i]
  idx = np.asarray(starts)
  return t_E[idx], ends_E[idx]


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Union of intervals [starts, ends), as sorted disjoint intervals."""
  keep = ends > starts
  starts, ends = starts[keep], ends[keep]
  if starts.size == 0:
    return starts, ends
  order = np.argsort(starts, kind="stable")
  s, e = starts[order], ends[order]
  reach = np.maximum.accumulate(e)
  first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])
  return s[first], np.maximum.reduceat(e, first)


def covered_below(starts: np.ndarray, ends: np.ndarray, x: np.ndarray) -> np.ndarray:
  """Length of the sorted disjoint intervals that lies below each x."""
  x = np.asarray(x, dtype=float)
  if starts.size == 0:
    return np.zeros_like(x)
  lengths = ends - starts
  cum = np.r_[0.0, np.cumsum(lengths)]
  k = np.searchsorted(starts, x, side="right")  # intervals that start at or before x
  prev = np.maximum(k - 1, 0)
  partial = np.where(k > 0, np.clip(x - starts[prev], 0.0, lengths[prev]), 0.0)
  return cum[prev] + partial


def covered_within(starts: np.ndarray, ends: np.ndarray, t0: float, t1: float) -> float:
  """Length of the sorted disjoint intervals inside [t0, t1)."""
  lo, hi = covered_below(starts, ends, np.array([t0, t1]))
  return float(hi - lo)


def time_with_quorum(
    down: Sequence[tuple[np.ndarray, np.ndarray]], quorum: int, t0: float, t1: float
) -> float:
  """Time in [t0, t1) during which at least `quorum` of the members are not down.

  `down` holds, per member, its sorted disjoint down intervals (starts, ends).
  """
  members = len(down)
  if not down or sum(s.size for s, _ in down) == 0:
    return (t1 - t0) if members >= quorum else 0.0
  times = np.concatenate([s for s, _ in down] + [e for _, e in down])
  delta = np.concatenate([np.ones(s.size) for s, _ in down] + [-np.ones(e.size) for _, e in down])
  order = np.argsort(times, kind="stable")
  times, down_count = times[order], np.cumsum(delta[order])
  bounds = np.r_[t0, np.clip(times, t0, t1), t1]
  up_count = members - np.r_[0.0, down_count]
  return float(np.diff(bounds)[up_count >= quorum].sum())
