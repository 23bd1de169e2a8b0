"""Where a run's metric rows go: metrics.jsonl (always), TensorBoard, Weights & Biases.

The `trackers` key names them ("jsonl,tensorboard"); `make` turns the names into tracker objects
once, where the run's MetricsWriter is built (diloco/metrics.py). Every tracker gets each row
already made JSON-friendly; TensorBoard and wandb log its numbers (`scalars`) at the row's step.
"""

import importlib.util
import json
import netrc
import os
import tempfile
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol

from diloco import jsonl, paths

WANDB_EXTRA = "wandb is not installed: pip install -e '.[wandb]'"


class Tracker(Protocol):
  """Receives every metric row of a run."""

  def write(self, row: dict[str, Any], prefix: str) -> None:
    ...

  def close(self) -> None:
    ...


def scalars(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
  """The row's numbers (not `step`, not booleans), keyed `prefix + key`."""
  return {
      f"{prefix}{k}": v
      for k, v in row.items()
      if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
  }


class Jsonl:
  """metrics.jsonl: one JSON object per row, flushed as written (tools read it during a run)."""

  def __init__(self, path: str, resume_step: int | None = None, resume_bytes: int | None = None):
    """`resume_step`: keep the rows up to that step; `resume_bytes`: keep the file's first
    bytes, as `position()` gave them (a snapshot's); neither: start a new file."""
    self.path = path
    if resume_bytes is not None and paths.is_url(path):
      self._file = jsonl.BucketAppend(path, keep_bytes=resume_bytes)
      return
    if resume_bytes is not None:
      with open(path, "r+b") as f:
        f.truncate(resume_bytes)
    elif resume_step is not None:
      self._truncate_after(resume_step)
    else:
      paths.remove(path)
    self._file = jsonl.open_append(path)

  def _truncate_after(self, step: int) -> None:
    """On resume, drops rows logged after the restored step (they will be logged again)."""
    if not paths.exists(self.path):
      return
    rows = [r for r in jsonl.read(self.path) if r.get("step", 0) <= step]  # a torn line dropped
    paths.write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))

  def write(self, row: dict[str, Any], prefix: str = "") -> None:
    del prefix  # the row's own keys say what it is
    self._file.write(json.dumps(row, sort_keys=True) + "\n")
    self._file.flush()

  def position(self) -> int:
    """Bytes written so far."""
    return self._file.tell()

  def sync(self) -> None:
    """The rows written so far are in the file (a bucket's is uploaded now)."""
    if isinstance(self._file, jsonl.BucketAppend):
      self._file.upload()

  def close(self) -> None:
    self._file.close()


class TensorBoard:
  """Event files under WORKDIR/tb (`tensorboard --logdir WORKDIR/tb`). For a bucket workdir they
  are written to a local directory and copied to WORKDIR/tb at each `sync` (a checkpoint) and at
  the close."""

  def __init__(self, workdir: str, config: Mapping[str, Any] | None = None):
    del config
    from tensorboardX import SummaryWriter

    self._target = paths.join(workdir, "tb")
    self._local = self._target if paths.is_local(workdir) else tempfile.mkdtemp(prefix="tb-")
    self._tb = SummaryWriter(logdir=self._local, flush_secs=10)

  def write(self, row: dict[str, Any], prefix: str = "") -> None:
    step = int(row.get("step", 0))
    for key, value in scalars(row, prefix).items():
      self._tb.add_scalar(key, value, global_step=step)

  def sync(self) -> None:
    """A bucket workdir's event files, as they are now, copied to WORKDIR/tb."""
    if self._local == self._target:
      return
    self._tb.flush()
    for name in os.listdir(self._local):
      paths.write_bytes(
          paths.join(self._target, name), paths.read_bytes(os.path.join(self._local, name))
      )

  def close(self) -> None:
    self._tb.close()
    self.sync()


class Wandb:
  """A Weights & Biases run under WORKDIR/wandb: each row is one `log` call with its `step` as
  the x-axis (learners' steps interleave, so wandb's own counter cannot be the step), and the
  resolved config as `wandb.config`. Offline (synced later with `wandb sync`) when
  WANDB_MODE=offline or no API key is found; WANDB_PROJECT names the project (default diloco)."""

  def __init__(self, workdir: str, config: Mapping[str, Any] | None = None):
    try:
      import wandb
    except ImportError as e:
      raise ImportError(WANDB_EXTRA) from e
    self._run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "diloco"),
        name=paths.basename(paths.absolute(workdir)),
        # wandb's own files need a local directory: a bucket run's go to a temporary one
        dir=workdir if paths.is_local(workdir) else tempfile.mkdtemp(prefix="wandb-"),
        config=dict(config or {}),
        mode=wandb_mode(),
        reinit="create_new",  # mode=compare logs one run per mode from one process
    )
    self._run.define_metric("step")
    self._run.define_metric("*", step_metric="step")

  def write(self, row: dict[str, Any], prefix: str = "") -> None:
    self._run.log({"step": int(row.get("step", 0)), **scalars(row, prefix)})

  def close(self) -> None:
    self._run.finish()


def wandb_mode() -> str:
  """WANDB_MODE when set; else online with an API key (env or ~/.netrc), offline without."""
  if os.environ.get("WANDB_MODE"):
    return os.environ["WANDB_MODE"]
  if os.environ.get("WANDB_API_KEY"):
    return "online"
  host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
  try:
    return "online" if netrc.netrc().authenticators(host or "") else "offline"
  except (OSError, netrc.NetrcParseError):
    return "offline"


# name -> tracker class; jsonl is always on (MetricsWriter opens it), so naming it adds nothing.
KINDS: dict[str, type | None] = {"jsonl": None, "tensorboard": TensorBoard, "wandb": Wandb}


def names(spec: str) -> list[str]:
  """'jsonl,tensorboard' -> ['jsonl', 'tensorboard'] (spaces and empty entries dropped)."""
  return [n.strip() for n in spec.split(",") if n.strip()]


def problems(spec: str) -> list[str]:
  """Why `spec` cannot be used: unknown names, wandb chosen but not installed."""
  known = sorted(KINDS)
  out = [f"unknown tracker {n!r}; expected some of {known}" for n in names(spec) if n not in KINDS]
  if "wandb" in names(spec) and importlib.util.find_spec("wandb") is None:
    out.append(WANDB_EXTRA)
  return out


def make(spec: str, workdir: str, config: Mapping[str, Any] | None = None) -> list[Tracker]:
  """The trackers `spec` names besides metrics.jsonl, each given the run's resolved config."""
  kinds = [KINDS[n] for n in dict.fromkeys(names(spec))]
  return [kind(workdir, config) for kind in kinds if kind is not None]
