"""The scavenging table from a sweep's rows (configs/sweeps/scavenging.py): the time a run takes to
reach the 4-learner run's final evaluation loss, relative to that run's, per number of extra
learners, beside the published rows; data-parallel given the same extra chips for the same
stretch, from the elastic pauses of the goodput simulator's calibration (sim/calibration.py).

Data-parallel here keeps its global batch when chips join (its loss by step does not change, so
it reaches its final loss when its steps are done) and speeds up in proportion to its chips:
the most favourable case for it. Each reconfiguration (chips joining, chips leaving) stops it for
a pause; `break_even_pause` is the pause at which its row would be 1.
"""

import math
from collections.abc import Iterable, Sequence
from typing import Any

from diloco.sim import calibration
from experiments.studies import outer_lr_search as search

# Published rows as issue 55 quotes them (a secondary source): training time relative to the
# 4-learner run with +25 / +50 / +100 / +300% extra compute.
PUBLISHED = {"dp": (1.07, 1.09, 1.02, 0.80), "decoupled": (0.90, 0.83, 0.75, 0.62)}
PUBLISHED_EXTRAS = (1, 2, 4, 12)  # the extra learners of those columns, to a base of 4
PAUSE_S = calibration.CALIBRATED["upscale_s"]  # = downscale_s: re-mesh with or without a unit


def time_to(curve: Sequence[dict[str, float]], target: float) -> float | None:
  """The first simulated time an eval curve ([{sim_time_s, eval_loss}], in time order) is at or
  below `target`, linear between evaluations; None if it never is."""
  prev = None
  for point in sorted(curve, key=lambda p: p["sim_time_s"]):  # (stable: a tie keeps its order)
    t, loss = float(point["sim_time_s"]), float(point["eval_loss"])
    if loss <= target:
      if prev is None:
        return t
      t0, l0 = prev
      return t0 + (l0 - target) / (l0 - loss) * (t - t0)
    prev = (t, loss)
  return None


def dp_time(
    work_s: float, extra: int, window: tuple[float, float], pause_s: float, base: int = 4
) -> float:
  """Time data-parallel on `base` units takes for `work_s` seconds of its own work when `extra`
  units are lent during `window` (start, end): it runs (base + extra) / base times as fast while
  it holds them and stops for `pause_s` when they join and again when they leave."""
  start, end = window
  if extra == 0 or work_s <= start:
    return work_s
  if start + pause_s >= end:
    raise ValueError(f"a pause of {pause_s} s does not fit in the window {window}")
  speed = (base + extra) / base
  resumed = start + pause_s  # the work done so far: `start` seconds' worth
  left = work_s - start
  if left <= (end - resumed) * speed:  # done while it holds them
    return resumed + left / speed
  return end + pause_s + left - (end - resumed) * speed


def break_even_pause(work_s: float, extra: int, window: tuple[float, float]) -> float:
  """The pause from which data-parallel's row is 1 or more (no faster than without the extra
  chips), by bisection; the window's length if even that pause leaves it faster. Its time jumps
  where the work stops ending inside the window (the leaving pause is then paid too), so this
  may be the pause of that jump rather than one where the row equals 1."""
  lo, hi = 0.0, window[1] - window[0] - 1e-9
  if dp_time(work_s, extra, window, hi) < work_s:
    return hi
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if dp_time(work_s, extra, window, mid) < work_s else (lo, mid)
  return (lo + hi) / 2


def relative_times(
    rows: Iterable[dict[str, Any]], base: Iterable[dict[str, Any]] | None = None
) -> dict[int, list[float | None]]:
  """extra learners -> per seed, the time to the same seed's 4-learner final eval loss over the
  4-learner run's own time to it (None: not reached before the run stopped). The 4-learner runs
  are `rows`' own, or `base`'s (another pair's: is this one faster than that one?)."""
  done = lambda rs: {  # noqa: E731
      (int(r["extra"]), int(r["seed"])): r for r in rs if r.get("status", "done") == "done"
  }
  by = done(rows)
  bases = by if base is None else done(base)
  out: dict[int, list[float | None]] = {}
  for (extra, seed), r in sorted(by.items()):
    four = bases.get((0, seed))
    if four is None:
      continue
    target = float(four["eval_loss"])
    own = time_to(four["eval_curve"], target)
    got = time_to(r["eval_curve"], target)
    out.setdefault(extra, []).append(None if got is None else got / own)
  return out


def spread(values: Sequence[float | None]) -> tuple[float, float]:
  """Mean and half range of the values (nan if any is None: a run that never got there)."""
  if not values or any(v is None for v in values):
    return math.nan, math.nan
  return sum(values) / len(values), search.half_range(values)


def dp_rows(extras: Sequence[int], work_s: float, window, pause_s: float = PAUSE_S) -> dict:
  """extra -> (data-parallel's relative time at `pause_s`, its break-even pause)."""
  return {
      k: (dp_time(work_s, k, window, pause_s) / work_s, break_even_pause(work_s, k, window))
      for k in extras
  }


def table(rows: Sequence[dict[str, Any]], work_s: float, window, base: int = 4) -> str:
  """The table in markdown: ours beside the published rows."""
  rel = relative_times(rows)
  extras = [k for k in sorted(rel) if k > 0]
  dp = dp_rows(extras, work_s, window)
  out = [
      "| extra learners (compute) | Decoupled, ours (seeds) | Decoupled, published"
      f" | data-parallel, ours (pause {PAUSE_S:g} s) | data-parallel, published"
      " | its break-even pause |",
      "|---|---|---|---|---|---|",
  ]
  for k in extras:
    mu, half = spread(rel[k])
    each = ", ".join("never" if v is None else f"{v:.3f}" for v in rel[k])
    pub = PUBLISHED_EXTRAS.index(k) if base == 4 and k in PUBLISHED_EXTRAS else None
    dec_pub = "" if pub is None else f"{PUBLISHED['decoupled'][pub]:.2f}"
    dp_pub = "" if pub is None else f"{PUBLISHED['dp'][pub]:.2f}"
    out.append(
        f"| +{k} (+{100 * k // base}%) | {mu:.3f} ± {half:.3f} ({each}) | {dec_pub}"
        f" | {dp[k][0]:.3f} | {dp_pub} | {dp[k][1]:.0f} s |"
    )
  return "\n".join(out)
