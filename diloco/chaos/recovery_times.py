"""How long recovery took in a run of real processes, from the synchronizer's merge log.

For each learner kill: seconds until its restarted process started (`restart_s`: its line in
starts.jsonl, written once it restored its checkpoint), until the first merge holding an upload of
that restarted process (`first_merge_s`), and the survivors' longest pause while it was away
(`survivors_longest_pause_s`: for each other learner, the longest gap between merges that include
it from the kill to the killed learner's first merge after rejoining, edges counted; the largest
over the survivors). For each synchronizer kill: seconds until the next merge.
"""

import random
from typing import Any


def _after(times, t: float) -> float | None:
  return min((x for x in times if x > t), default=None)


def _longest_gap(times: list[float], start: float, end: float) -> float:
  inside = sorted(t for t in times if start < t < end)
  edges = [start, *inside, end]
  return max(b - a for a, b in zip(edges, edges[1:]))


def _learner_kill(merges, t: float, m: int, starts, learners: int, end: float) -> dict:
  back = _after(starts.get(m, []), t)
  first = None
  if back is not None:
    first = _after((r["time"] for r in merges if m in r["learners"]), back)
  until = end if first is None else first
  pauses = [
      _longest_gap([r["time"] for r in merges if s in r["learners"]], t, until)
      for s in range(learners)
      if s != m
  ]
  return {
      "learner": m,
      "killed_at": t,
      "restart_s": None if back is None else back - t,
      "first_merge_s": None if first is None else first - t,
      "survivors_longest_pause_s": max(pauses, default=None),
  }


def recovery(
    merges: list[dict[str, Any]],
    kills: list[dict[str, Any]],
    starts: dict[int, list[float]],
    learners: int,
) -> dict[str, Any]:
  """`merges`: {time, learners} per merge (wall clock); `kills`: {time, process} with process
  "sync" or "learner<m>"; `starts`: per learner, the wall times its processes started."""
  out = {"learner_kills": [], "sync_kills": []}
  merge_times = sorted(r["time"] for r in merges)
  end = merge_times[-1] if merge_times else 0.0
  for k in sorted(kills, key=lambda k: k["time"]):
    t = k["time"]
    if k["process"] == "sync":
      nxt = _after(merge_times, t)
      out["sync_kills"].append({"killed_at": t, "first_merge_s": None if nxt is None else nxt - t})
    else:
      m = int(k["process"][len("learner") :])
      out["learner_kills"].append(_learner_kill(merges, t, m, starts, learners, end))
  return out


def worst(report: dict[str, Any]) -> dict[str, float | None]:
  """The largest figure of each kind (None where no kill of that kind recovered)."""

  def top(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None

  return {
      "learner_kill_to_first_merge_s": top(k["first_merge_s"] for k in report["learner_kills"]),
      "sync_kill_to_next_merge_s": top(k["first_merge_s"] for k in report["sync_kills"]),
      "survivors_longest_pause_s": top(
          k["survivors_longest_pause_s"] for k in report["learner_kills"]
      ),
  }


def kill_plan(
    seed: int, duration_s: float, kills: int, learners: int, sync_share: float
) -> list[tuple[float, str]]:
  """Seeded SIGKILLs for a run of real processes: (time, "sync" | "learner<m>"), times uniform
  over 5-85% of the run; each picks the synchronizer with probability `sync_share`."""
  rng = random.Random(seed)
  times = sorted(rng.uniform(0.05, 0.85) * duration_s for _ in range(kills))
  victims = [
      "sync" if rng.random() < sync_share else f"learner{rng.randrange(learners)}" for _ in times
  ]
  return list(zip(times, victims))
