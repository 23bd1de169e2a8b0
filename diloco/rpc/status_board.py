"""What the status service shows of a running synchronizer, kept apart from its lock.

The synchronizer process feeds the board from the hooks it already has (every logged record, every
learner heartbeat, the service's byte counts); each feed takes the board's own lock for a few
dictionary updates. `snapshot()` copies the board and reads the few live values of the host and
state machine it needs (generation, live learners, versions, refusal counts) as single C-level
copies, never taking the host's lock: a status request can neither block nor be blocked by the
gRPC handlers. The snapshot is the JSON of `/status`; `/metrics` and the HTML page are drawn
from it (diloco/watch/status_page.py).
"""

import collections
import threading
import time
from typing import Any

RECENT = 8  # merges per fragment kept for the page
HISTORY = 600  # points per curve (merges, each learner's loss)
RATE_WINDOW_S = 60.0  # merges per second over this window


class StatusBoard:
  """History and per-learner figures of one synchronizer process, for /status."""

  def __init__(self, host=None, service=None, clock=time.monotonic):
    self.host, self.service, self.clock = host, service, clock  # set host before any feed
    self.t0 = clock()
    self._lock = threading.Lock()
    self._reports: dict[int, dict] = {}
    self._seen: dict[int, float] = {}  # learner -> host time of its last heartbeat or upload
    self._staleness: dict[int, int] = {}  # learner -> staleness of its last merged upload
    self._recent: dict[int, collections.deque] = {}
    self._merge_times: collections.deque = collections.deque(maxlen=HISTORY)
    self._loss: dict[int, collections.deque] = {}
    self._merges = 0
    self._refused: dict[str, int] = {}  # refusals of the status service itself
    self.shard: int | None = None  # this process's shard of outer.sync_shards > 1

  def count(self, code: str) -> None:
    """A refused status request (never the host's lock: the status service must not wait)."""
    with self._lock:
      self._refused[code] = self._refused.get(code, 0) + 1

  def refusals(self) -> dict[str, int]:
    """Refusals by code: the host's (gRPC) and the status service's, added."""
    counts = self.host.counts.copy()
    with self._lock:
      for code, n in self._refused.items():
        counts[code] = counts.get(code, 0) + n
    return dict(sorted(counts.items()))

  # ---- feeds (each under the board's lock only) ----

  def log(self, record: dict) -> None:
    """A record the synchronizer host logged (merges are what the board keeps)."""
    if record.get("event") != "merge":
      return
    with self._lock:
      self._merges += 1
      t = float(record["time"])
      self._merge_times.append((t, self._merges))
      recent = self._recent.setdefault(record["fragment"], collections.deque(maxlen=RECENT))
      recent.append(
          {
              "time": t,
              "version": record["version"],
              "quorum": record["quorum"],
              "grace_s": record["grace_s"],
              "learners": list(record["learners"]),
          }
      )
      for m, s in zip(record["learners"], record["staleness"]):
        self._staleness[m] = s
        self._seen[m] = t

  def report(self, learner: int, report: dict) -> None:
    """What learner `learner`'s heartbeat said of itself (step, tokens, loss, finished)."""
    now = self.host.now()
    with self._lock:
      self._reports[learner] = dict(report)
      self._seen[learner] = now
      if report.get("loss") is not None:
        curve = self._loss.setdefault(learner, collections.deque(maxlen=HISTORY))
        if not curve or curve[-1][1] != report.get("step"):
          curve.append((now, report.get("step"), float(report["loss"])))

  # ---- the snapshot ----

  def snapshot(self) -> dict[str, Any]:
    """The JSON of /status (see the README's "Watching a run" for its keys)."""
    sync, now = self.host.sync, self.host.now()
    live, versions = set(sync.live), list(sync.versions)
    held, refusals = dict(sync.held), self.refusals()
    with self._lock:
      reports = {m: dict(r) for m, r in self._reports.items()}
      seen, staleness = dict(self._seen), dict(self._staleness)
      recent = {p: list(d) for p, d in self._recent.items()}
      merge_times, merges = list(self._merge_times), self._merges
      loss = {m: list(d) for m, d in self._loss.items()}
    ids = sorted(set(reports) | set(held) | live)
    window = [t for t, _ in merge_times if t >= now - RATE_WINDOW_S]
    owned = set(getattr(sync, "owned", range(len(versions))))
    return {
        "shard": self.shard,
        "generation": sync.generation,
        "uptime_s": self.clock() - self.t0,
        "time_s": now,
        "merges": merges,
        "merges_per_s": len(window) / min(RATE_WINDOW_S, max(now, 1e-9)),
        "refusals": refusals,
        "versions": versions,
        "learners": [self._learner(m, m in live, reports, seen, staleness, held, now) for m in ids],
        "fragments": [
            {
                "fragment": p,
                "version": v,
                "last_merge_s": recent[p][-1]["time"] if recent.get(p) else None,
                "recent": recent.get(p, []),
            }
            for p, v in enumerate(versions)
            if p in owned
        ],
        "history": {
            "merges": [[t, n] for t, n in merge_times],
            "loss": {str(m): [[t, s, x] for t, s, x in c] for m, c in sorted(loss.items())},
        },
    }

  def _learner(self, m, is_live, reports, seen, staleness, held, now) -> dict[str, Any]:
    r = reports.get(m, {})
    up, down = self.service.bytes_of(m) if self.service is not None else (0, 0)
    return {
        "learner": m,
        "live": is_live,
        "finished": bool(r.get("finished", False)),
        "last_progress_s": now - seen[m] if m in seen else None,
        "step": r.get("step"),
        "tokens": r.get("tokens"),
        "loss": r.get("loss"),
        "versions": list(held.get(m, [])),
        "staleness": staleness.get(m),
        "bytes_up": up,
        "bytes_down": down,
    }
