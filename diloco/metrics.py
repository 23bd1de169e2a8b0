"""Run outputs: metrics.jsonl, TensorBoard event files and summary.json."""

import hashlib
import json
import math
import os
from typing import Any

import numpy as np
from tensorboardX import SummaryWriter

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
  """Appends one JSON object per event to metrics.jsonl and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str, resume_step: int | None = None, resume_bytes: int | None = None):
    """`resume_step`: keep the rows up to that step; `resume_bytes`: keep the file's first
    bytes, as `position()` gave them (a snapshot's); neither: start a new file."""
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, METRICS_FILE)
    if resume_bytes is not None:
      with open(self.path, "r+b") as f:
        f.truncate(resume_bytes)
    elif resume_step is not None:
      self._truncate_after(resume_step)
    elif os.path.exists(self.path):
      os.remove(self.path)
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = SummaryWriter(logdir=os.path.join(workdir, "tb"), flush_secs=10)

  def _truncate_after(self, step: int) -> None:
    """On resume, drops rows logged after the restored step (they will be logged again)."""
    if not os.path.exists(self.path):
      return
    with open(self.path, encoding="utf-8") as f:
      rows = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(rows)
    os.replace(tmp, self.path)

  def write(self, row: dict[str, Any], prefix: str = "") -> None:
    """Logs one event; numeric values also go to TensorBoard under `prefix/`."""
    row = _plain(row)
    self._file.write(json.dumps(row, sort_keys=True) + "\n")
    self._file.flush()
    step = int(row.get("step", 0))
    for key, value in row.items():
      if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
        self._tb.add_scalar(f"{prefix}{key}", value, global_step=step)

  def position(self) -> int:
    """Bytes written to metrics.jsonl so far (every row is flushed as it is written)."""
    return self._file.tell()

  def close(self) -> None:
    self._file.close()
    self._tb.close()


def params_sha256(flat: dict[str, Any]) -> str:
  """sha256 over path-keyed arrays (sorted by path): each path, dtype, shape and bytes."""
  h = hashlib.sha256()
  for k in sorted(flat):
    x = np.ascontiguousarray(np.asarray(flat[k]))
    h.update(f"{k}:{x.dtype}:{x.shape}".encode())
    h.update(x.tobytes())
  return h.hexdigest()


def write_summary(workdir: str, summary: dict[str, Any]) -> str:
  """Writes summary.json atomically and returns its path."""
  path = os.path.join(workdir, SUMMARY_FILE)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(_plain(summary), f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)
  return path


def read_jsonl(path: str) -> list[dict[str, Any]]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
