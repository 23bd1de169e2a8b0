"""Run outputs: metrics.jsonl and the other trackers' files, and summary.json."""

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from diloco import jsonl, paths
from diloco.watch import trackers as trackers_lib

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def _plain(value: Any) -> Any:
  """JSON-friendly: numpy scalars to Python, non-finite floats to None."""
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


class MetricsWriter:
  """Appends one JSON object per event to metrics.jsonl and mirrors it to the chosen trackers
  (diloco/watch/trackers.py: TensorBoard, wandb)."""

  def __init__(
      self,
      workdir: str,
      resume_step: int | None = None,
      resume_bytes: int | None = None,
      trackers: str = "jsonl,tensorboard",
      config: Mapping[str, Any] | None = None,
  ):
    """`resume_step`: keep the rows up to that step; `resume_bytes`: keep the file's first
    bytes, as `position()` gave them (a snapshot's); neither: start a new file. `trackers`: the
    `trackers` key; `config`: the resolved config the trackers record (wandb.config)."""
    paths.makedirs(workdir)
    self.path = paths.join(workdir, METRICS_FILE)
    self._jsonl = trackers_lib.Jsonl(self.path, resume_step, resume_bytes)
    self._trackers = [self._jsonl, *trackers_lib.make(trackers, workdir, config)]

  @classmethod
  def for_run(cls, config: ml_collections.ConfigDict, workdir: str, **resume: Any):
    """The writer of a run of `config`: its `trackers`, given the resolved config. Of an island
    of several processes sharing the workdir, process 0's alone (the others' `Unwritten`)."""
    import jax

    if jax.process_index() != 0:
      return Unwritten()
    spec = config.get("trackers", "jsonl,tensorboard")
    return cls(workdir, **resume, trackers=spec, config=json.loads(config.to_json()))

  def write(self, row: dict[str, Any], prefix: str = "") -> None:
    """Logs one event; trackers other than JSONL log its numbers under `prefix`."""
    row = _plain(row)
    for tracker in self._trackers:
      tracker.write(row, prefix)

  def position(self) -> int:
    """Bytes written to metrics.jsonl so far (locally every row is flushed as it is written; in
    a bucket they are there after `sync`)."""
    return self._jsonl.position()

  def sync(self) -> None:
    """Every row written so far is in the run's files (a bucket's are uploaded now)."""
    for tracker in self._trackers:
      if hasattr(tracker, "sync"):
        tracker.sync()

  def close(self) -> None:
    for tracker in self._trackers:
      tracker.close()


class Unwritten:
  """A `MetricsWriter` that writes nothing: a process other than 0 of a multi-process island,
  whose rows process 0 writes (two writers of one file would truncate and rename it at once)."""

  def write(self, row: dict[str, Any], prefix: str = "") -> None:
    del row, prefix

  def position(self) -> int:
    return 0

  def sync(self) -> None:
    pass

  def close(self) -> None:
    pass


def aux_terms(step_metrics: dict[str, Any]) -> dict[str, float]:
  """The parts of a training objective logged beside the loss: the mixture of experts' routing
  stats (`moe_*`) and the output z-loss (`z_loss`), where the step reports them."""
  return {k: float(v) for k, v in step_metrics.items() if k.startswith("moe_") or k == "z_loss"}


def params_sha256(flat: dict[str, Any]) -> str:
  """sha256 over path-keyed arrays (sorted by path): each path, dtype, shape and bytes."""
  h = hashlib.sha256()
  for k in sorted(flat):
    x = np.ascontiguousarray(np.asarray(flat[k]))
    h.update(f"{k}:{x.dtype}:{x.shape}".encode())
    h.update(x.tobytes())
  return h.hexdigest()


def write_summary(workdir: str, summary: dict[str, Any]) -> str:
  """Writes summary.json whole or not at all and returns its path."""
  path = paths.join(workdir, SUMMARY_FILE)
  paths.write_text(path, json.dumps(_plain(summary), indent=2, sort_keys=True) + "\n")
  return path


def read_jsonl(path: str) -> list[dict[str, Any]]:
  return jsonl.read(path)


def merged_shares(
    work: dict[int, dict[str, dict[int, int]]], trained: dict[int, int], fragments: int
) -> dict[str, dict[str, Any]]:
  """Per learner: inner steps trained (`trained`), and of them the steps and tokens that reached
  a merge per fragment (`Synchronizer.merged_work`), with the merged share: merged steps summed
  over the `fragments` fragments, over fragments × trained (each step trains every fragment)."""
  out = {}
  for m in sorted(set(work) | set(trained)):
    w, t = work.get(m, {"steps": {}, "tokens": {}}), trained.get(m)
    merged = sum(w["steps"].values())
    out[str(m)] = {
        "trained_steps": t,
        "merged_steps": {str(p): n for p, n in sorted(w["steps"].items())},
        "merged_tokens": sum(w["tokens"].values()),
        "merged_share": merged / (fragments * t) if t else None,
    }
  return out


def learner_work(learners: list, sync) -> dict[str, dict[str, Any]]:
  """Per learner (by str index), `merged_shares` of its steps trained."""
  trained = {m: l.steps for m, l in enumerate(learners)}
  shares = merged_shares(sync.merged_work(), trained, learners[0].frag.num_fragments)
  return {str(m): shares[str(m)] for m in range(len(learners))}


def merged_share(rows: list[dict[str, Any]]) -> float | None:
  """The share of all learners' trained steps whose progress reached a merge (steps-weighted)."""
  trained = sum(r["steps"] for r in rows)
  if not trained:
    return None
  return (
      sum(r["merged_share"] * r["steps"] for r in rows if r["merged_share"] is not None) / trained
  )
