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

from diloco import metrics

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
    # learner -> session -> [the step its process started at, the last step it reported]
    self._sessions: dict[int, dict[str, list[int]]] = {}
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

  def trained_steps(self) -> dict[int, int]:
    """Learner -> inner steps trained over its processes (sessions, in the order they came):
    the furthest step any reached, plus the steps trained again by a process that started
    behind that (restored from an older checkpoint, or from scratch). A process that died after
    its last heartbeat is counted as far as its heartbeats and uploads (`uploaded`) showed; one
    that reported nothing, not at all."""
    with self._lock:
      return {m: _trained(list(s.values())) for m, s in sorted(self._sessions.items())}

  def sessions(self) -> dict[str, dict[str, list[int]]]:
    """The table behind `trained_steps`, as JSON (a synchronizer checkpoint keeps it)."""
    with self._lock:
      return {str(m): {k: list(v) for k, v in s.items()} for m, s in self._sessions.items()}

  def load_sessions(self, table: dict) -> None:
    """Takes `sessions()` of the synchronizer process before a restart."""
    with self._lock:
      for m, s in table.items():
        self._sessions.setdefault(int(m), {}).update({k: list(v) for k, v in s.items()})

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
      if report.get("step") is not None and report.get("session"):
        span = self._sessions.setdefault(learner, {}).setdefault(
            report["session"], [report.get("start", 0), report["step"]]
        )
        span[1] = max(span[1], report["step"])
      self._seen[learner] = now
      if report.get("loss") is not None:
        curve = self._loss.setdefault(learner, collections.deque(maxlen=HISTORY))
        if not curve or curve[-1][1] != report.get("step"):
          curve.append((now, report.get("step"), float(report["loss"])))

  def uploaded(self, learner: int, session: str, step: int) -> None:
    """An upload of `learner`'s process `session` sent after inner step `step`: it trained that
    far, though killed before a heartbeat said so (a session no heartbeat opened is left out:
    where it started is not known)."""
    with self._lock:
      span = self._sessions.get(learner, {}).get(session)
      if span is not None and step >= 0:
        span[1] = max(span[1], step)

  # ---- the snapshot ----

  def snapshot(self) -> dict[str, Any]:
    """The JSON of /status (docs/watching.md lists its keys)."""
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
    work = metrics.merged_shares(sync.merged_work(), self.trained_steps(), len(owned))
    return {
        "shard": self.shard,
        "generation": sync.generation,
        "uptime_s": self.clock() - self.t0,
        "time_s": now,
        "merges": merges,
        "merges_per_s": len(window) / min(RATE_WINDOW_S, max(now, 1e-9)),
        "refusals": refusals,
        "versions": versions,
        "learners": [
            {
                **self._learner(m, m in live, reports, seen, staleness, held, now),
                "merged_share": work.get(str(m), {}).get("merged_share"),
            }
            for m in ids
        ],
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
    heard, absent = self.host.last_seen.get(m), self.host.absent_since.get(m)
    return {
        "learner": m,
        "live": is_live,
        "finished": bool(r.get("finished", False)),
        "last_progress_s": now - seen[m] if m in seen else None,
        "last_seen_s": now - heard if heard is not None else None,
        "absent_s": now - absent if absent is not None and not is_live else None,
        "step": r.get("step"),
        "tokens": r.get("tokens"),
        "loss": r.get("loss"),
        "versions": list(held.get(m, [])),
        "staleness": staleness.get(m),
        "bytes_up": up,
        "bytes_down": down,
    }


def _trained(spans: list[list[int]]) -> int:
  """`StatusBoard.trained_steps` of one learner's [start, last] per process, in order."""
  reached = again = 0
  for start, last in spans:
    again += max(reached - start, 0)
    reached = max(reached, last)
  return reached + again
