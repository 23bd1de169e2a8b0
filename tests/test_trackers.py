"""Trackers: metrics.jsonl always, TensorBoard and wandb when chosen by the `trackers` key.

wandb runs offline here (WANDB_MODE=offline: nothing touches the network). An offline run keeps
everything it logged in its transaction log, WORKDIR/wandb/offline-run-*/run-*.wandb, which
`wandb sync` uploads later. wandb 0.31 ships no Python reader of it (the log is written by the Go
`wandb-core`; `wandb.Api` needs the server), so `_wandb_records` reads it here: a LevelDB-style log
(a 7-byte header `:W&B` + magic + version, then 32 KiB blocks of chunks, each a CRC-32 of type and
data, a 2-byte length and a type: full, first, middle or last) whose records are
`wandb.proto.wandb_internal_pb2.Record` messages; `history` records are the `log` calls and the
`run` record holds the config.
"""

import glob
import json
import os
import stat
import sys
import zlib

import pytest

from configs import shakespeare
from diloco import metrics, train
from diloco.config import checks
from diloco.watch import trackers

BLOCK = 32 * 1024  # bytes per block of the transaction log
CHUNK_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, LAST = 1, 4


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
  """wandb never reaches the network and writes only under tmp_path."""
  pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
  monkeypatch.setenv("WANDB_SILENT", "true")


def _wandb_records(path: str) -> list:
  """Every record of an offline run's transaction log, each chunk's CRC checked."""
  from wandb.proto import wandb_internal_pb2

  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B"
  pos, pending, out = CHUNK_HEADER, b"", []
  while pos + CHUNK_HEADER <= len(data):
    left = BLOCK - pos % BLOCK
    if left < CHUNK_HEADER:  # a block's tail too short for a chunk header is padding
      pos += left
      continue
    crc = int.from_bytes(data[pos : pos + 4], "little")
    n, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
    chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + n]
    assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad chunk at byte {pos}"
    pos += CHUNK_HEADER + n
    pending += chunk
    if kind in (FULL, LAST):
      out.append(wandb_internal_pb2.Record.FromString(pending))
      pending = b""
  return out


def _offline_run(workdir) -> tuple[list[dict], dict]:
  """The history rows and the config of the run in `workdir` (wandb's own `_` keys dropped)."""
  import wandb

  wandb.teardown()  # the service process writes the log: complete once it has stopped
  (path,) = glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))
  history, config = [], {}
  for record in _wandb_records(path):
    kind = record.WhichOneof("record_type")
    if kind == "history":
      items = {
          "/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item
      }
      history.append({k: v for k, v in items.items() if not k.startswith("_")})
    elif kind == "run":
      items = {i.key: json.loads(i.value_json) for i in record.run.config.update}
      config = {k: v for k, v in items.items() if not k.startswith("_")}
  return history, config


def _config(arg: str, **keys):
  c = shakespeare.get_config(arg)
  with c.unlocked():
    c.progress_bar = False
    c.update(keys)
  return c


def test_a_wandb_run_logs_the_jsonl_rows_and_the_resolved_config(tmp_path, offline_wandb):
  """Decoupled DiLoCo: learner, merge and evaluation rows, learners' steps interleaved."""
  workdir = tmp_path / "run"
  train.train_and_evaluate(_config("runlocal,mode=decoupled", trackers="jsonl,wandb"), str(workdir))
  rows = metrics.read_jsonl(workdir / metrics.METRICS_FILE)
  history, config = _offline_run(workdir)
  assert len(history) == len(rows) >= 10
  for logged, row in zip(history, rows):
    # Trackers name a learner's, the synchronizer's or a fault's numbers under a prefix
    # (learner0/loss, sync/quorum); the JSONL row says the same in its own keys.
    assert logged["step"] == row["step"]
    unprefixed = {k.rsplit("/", 1)[-1]: v for k, v in logged.items() if k != "step"}
    assert unprefixed == trackers.scalars(row), row
  assert any("eval_loss" in h for h in history)
  with open(workdir / "config.json", encoding="utf-8") as f:
    assert config == json.load(f)
  assert config["mode"] == "decoupled" and config["trackers"] == "jsonl,wandb"
  assert not (workdir / "tb").exists()  # not chosen


def test_the_wandb_tracker_logs_rows_that_span_blocks_of_its_log(tmp_path, offline_wandb):
  """Rows written straight to a MetricsWriter; more than one 32 KiB block of the log."""
  writer = metrics.MetricsWriter(str(tmp_path), trackers="wandb", config={"seed": 3})
  rows = [{"step": i // 2, "learner": i % 2, "loss": 1 / (i + 1)} for i in range(1000)]
  for row in rows:
    writer.write(row, prefix=f"learner{row['learner']}/")
  writer.close()
  history, config = _offline_run(tmp_path)
  (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
  assert os.path.getsize(path) > 2 * BLOCK
  assert config == {"seed": 3}
  assert history == [
      {"step": r["step"], **trackers.scalars(r, f"learner{r['learner']}/")} for r in rows
  ]


def test_tensorboard_writes_event_files_only_when_chosen(tmp_path):
  for spec in ("jsonl", "jsonl,tensorboard"):
    writer = metrics.MetricsWriter(str(tmp_path / spec), trackers=spec)
    writer.write({"step": 1, "loss": 2.5, "final": True})
    writer.close()
    assert metrics.read_jsonl(tmp_path / spec / metrics.METRICS_FILE) == [
        {"step": 1, "loss": 2.5, "final": True}
    ]
  assert not (tmp_path / "jsonl" / "tb").exists()
  assert glob.glob(str(tmp_path / "jsonl,tensorboard" / "tb" / "events.out.tfevents*"))


def test_scalars_are_the_numbers_of_a_row_under_its_prefix():
  row = {"step": 3, "loss": 1.5, "learner": 0, "final": False, "event": "merge", "weights": [1]}
  assert trackers.scalars(row, "learner0/") == {"learner0/loss": 1.5, "learner0/learner": 0}


def test_wandb_chosen_but_not_installed_stops_the_run_before_it_starts(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # find_spec: not installed
  workdir = tmp_path / "run"
  with pytest.raises(checks.ConfigError) as e:
    train.train_and_evaluate(_config("runlocal", trackers="jsonl,wandb,mlflow"), str(workdir))
  message = str(e.value)
  assert "trackers='jsonl,wandb,mlflow': wandb is not installed: pip install -e '.[wandb]'" in (
      message
  )
  assert "unknown tracker 'mlflow'" in message
  assert not workdir.exists()


def test_wandb_runs_offline_without_an_api_key(tmp_path, monkeypatch):
  for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
    monkeypatch.delenv(key, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  assert trackers.wandb_mode() == "offline"
  netrc = tmp_path / ".netrc"
  netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
  netrc.chmod(stat.S_IRUSR | stat.S_IWUSR)
  assert trackers.wandb_mode() == "online"
  monkeypatch.setenv("WANDB_MODE", "offline")
  assert trackers.wandb_mode() == "offline"
  monkeypatch.delenv("WANDB_MODE")
  netrc.unlink()
  monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
  assert trackers.wandb_mode() == "online"
