"""A workdir holding another run is refused with the differing keys, or moved aside whole with
--restart; claiming writes nothing else (diloco/recovery/workdir.py)."""

import json
import math
import os
import subprocess
import sys

import proc_helpers
import pytest

from configs import shakespeare
from diloco import metrics, train
from diloco.recovery import workdir as workdir_lib
from diloco.rpc import forked

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OLD = {"seed": 0, "steps": 40, "optimizer": {"name": "adamw", "lr": 0.01}, "mesh": {"fsdp": 1}}


def _run(path, config=OLD, outputs=("metrics.jsonl",)):
  """A workdir as a run leaves it: config.json (unless None) and some outputs."""
  if config is not None:
    workdir_lib.write_config(str(path), json.dumps(config, indent=2))
  os.makedirs(path, exist_ok=True)
  for name in outputs:
    if name == "checkpoints":
      os.makedirs(path / name / "20")
      (path / name / "20" / "state").write_bytes(b"weights")
    else:
      (path / name).write_text(f"{name} of the old run\n")
  return path


def _snapshot(root):
  """Every path under `root` with its mtime and contents: what a refusal must leave unchanged."""
  out = {}
  for dirpath, dirs, files in os.walk(root):
    for name in dirs + files:
      p = os.path.join(dirpath, name)
      out[os.path.relpath(p, root)] = (
          os.stat(p).st_mtime_ns,
          None if os.path.isdir(p) else open(p, "rb").read(),
      )
  return out


def test_a_missing_or_empty_workdir_is_new_and_nothing_is_created(tmp_path):
  assert workdir_lib.claim(str(tmp_path / "missing"), OLD) == "new"
  assert not (tmp_path / "missing").exists()
  (tmp_path / "empty").mkdir()
  assert workdir_lib.claim(str(tmp_path / "empty"), OLD, restart=True) == "new"
  assert sorted(os.listdir(tmp_path)) == ["empty"]


def test_the_same_config_resumes_tuples_and_lists_alike(tmp_path):
  path = _run(tmp_path / "run", {**OLD, "sim": {"speeds": [1, 3]}})
  before = _snapshot(tmp_path)
  assert workdir_lib.claim(str(path), {**OLD, "sim": {"speeds": (1, 3)}}) == "resume"
  assert _snapshot(tmp_path) == before


def test_a_differing_config_is_refused_with_each_differing_key_old_and_new(tmp_path):
  path = _run(tmp_path / "run")
  new = {"steps": 40, "optimizer": {"name": "adamw", "lr": 0.001}, "mesh": {"fsdp": 1.0}}
  new["model"] = {"dtype": "bfloat16"}
  with pytest.raises(workdir_lib.WorkdirError) as e:
    workdir_lib.claim(str(path), new)
  lines = str(e.value).splitlines()
  assert lines[0] == (
      f"workdir {path} holds a run whose config.json differs from this run's config"
      " (workdir's -> this run's):"
  )
  assert lines[1:5] == [
      "  mesh.fsdp: 1 -> 1.0",  # as JSON writes them: 1 and 1.0 differ
      '  model.dtype: (absent) -> "bfloat16"',
      "  optimizer.lr: 0.01 -> 0.001",
      "  seed: 0 -> (absent)",
  ]
  assert lines[5:] == [
      f"To start over, pass --restart: it moves the old run to {path}.old-1 (nothing is"
      " deleted). Or pick another --workdir."
  ]


def test_a_long_difference_lists_twenty_keys_and_counts_the_rest(tmp_path):
  path = _run(tmp_path / "run", {f"k{i:02d}": i for i in range(30)})
  with pytest.raises(workdir_lib.WorkdirError) as e:
    workdir_lib.claim(str(path), {f"k{i:02d}": -i for i in range(1, 31)})
  lines = str(e.value).splitlines()[1:-1]
  assert len(lines) == 21 and lines[0] == "  k00: 0 -> (absent)" and lines[19] == "  k19: 19 -> -19"
  assert lines[20] == "  and 11 more"


def test_a_bool_is_no_int(tmp_path):
  path = _run(tmp_path / "run", {"remat": 1})
  with pytest.raises(workdir_lib.WorkdirError, match="  remat: 1 -> true"):
    workdir_lib.claim(str(path), {"remat": True})


@pytest.mark.parametrize("outputs", [("summary.json",), ("metrics.jsonl",), ("checkpoints",)])
def test_a_run_without_config_json_is_refused_and_nothing_is_written(tmp_path, outputs):
  path = _run(tmp_path / "run", None, outputs)
  before = _snapshot(tmp_path)
  with pytest.raises(workdir_lib.WorkdirError) as e:
    workdir_lib.claim(str(path), OLD)
  assert str(e.value).splitlines() == [
      f"workdir {path} holds a run without config.json ({outputs[0]} found).",
      f"To start over, pass --restart: it moves the old run to {path}.old-1 (nothing is"
      " deleted). Or pick another --workdir.",
  ]
  assert _snapshot(tmp_path) == before


def test_a_refused_claim_writes_nothing(tmp_path):
  path = _run(tmp_path / "run", outputs=("summary.json", "metrics.jsonl", "checkpoints"))
  before = _snapshot(tmp_path)
  with pytest.raises(workdir_lib.WorkdirError):
    workdir_lib.claim(str(path), {**OLD, "seed": 1})
  assert _snapshot(tmp_path) == before


def test_an_unreadable_config_json_is_refused(tmp_path):
  path = tmp_path / "run"
  workdir_lib.write_config(str(path), '{"seed": 0,')  # cut short
  with pytest.raises(workdir_lib.WorkdirError, match="config.json is not a readable JSON object"):
    workdir_lib.claim(str(path), OLD)


def test_a_file_is_no_workdir(tmp_path):
  (tmp_path / "run").write_text("x")
  with pytest.raises(workdir_lib.WorkdirError, match="is not a directory"):
    workdir_lib.claim(str(tmp_path / "run"), OLD)


def test_restart_moves_the_old_run_aside_whole_then_to_the_next_free_name(tmp_path):
  path = _run(tmp_path / "run", outputs=("metrics.jsonl", "checkpoints"))
  first = _snapshot(path)
  assert workdir_lib.claim(str(path), {**OLD, "seed": 1}, restart=True) == "restarted"
  assert not path.exists() and _snapshot(tmp_path / "run.old-1") == first

  _run(path, {**OLD, "seed": 1}, outputs=("summary.json",))
  second = _snapshot(path)
  assert workdir_lib.claim(str(path), {**OLD, "seed": 1}, restart=True) == "restarted"  # same
  assert sorted(os.listdir(tmp_path)) == ["run.old-1", "run.old-2"]
  assert _snapshot(tmp_path / "run.old-1") == first and _snapshot(tmp_path / "run.old-2") == second


def test_restart_moves_a_run_without_config_json_aside(tmp_path):
  path = _run(tmp_path / "run", None, ("checkpoints",))
  assert workdir_lib.claim(str(path) + "/", OLD, restart=True) == "restarted"
  assert sorted(os.listdir(tmp_path)) == ["run.old-1"]
  assert (tmp_path / "run.old-1" / "checkpoints" / "20" / "state").read_bytes() == b"weights"


def test_write_config_creates_the_directory_and_replaces_the_file_whole(tmp_path, monkeypatch):
  path = tmp_path / "a" / "run"
  workdir_lib.write_config(str(path), '{"seed": 0}')
  assert os.listdir(path) == ["config.json"] and json.loads((path / "config.json").read_text())

  def crash(src, dst):
    raise OSError("disk full")

  monkeypatch.setattr(os, "replace", crash)
  with pytest.raises(OSError, match="disk full"):
    workdir_lib.write_config(str(path), '{"seed": 1}')
  assert os.listdir(path) == ["config.json"]  # no temporary file left behind
  assert (path / "config.json").read_text() == '{"seed": 0}'


# ---- one run at a time (issue 49, point 8) ----


HOLDER = (
    "import sys; from diloco.recovery import workdir as w; w.Hold(sys.argv[1]).acquire(); "
    "print('held', flush=True); sys.stdin.read()"
)


def _holder(workdir) -> subprocess.Popen:
  """A process that holds `workdir` until its stdin closes."""
  proc = subprocess.Popen(
      [sys.executable, "-c", HOLDER, str(workdir)],
      cwd=REPO,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
  )
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_held_workdir_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(
    tmp_path, monkeypatch
):
  holder = _holder(tmp_path)
  with pytest.raises(
      workdir_lib.WorkdirError, match=rf"in use by another run: PID {holder.pid} on host"
  ):
    workdir_lib.Hold(str(tmp_path)).acquire()
  holder.stdin.close()
  assert holder.wait(30) == 0
  assert not os.path.exists(tmp_path / workdir_lib.HOLD)  # released and removed at exit
  # A holder killed by SIGKILL leaves its file; the kernel dropped its lock: taken over, noted.
  holder = _holder(tmp_path)
  holder.kill()
  holder.wait(30)
  notes = []
  monkeypatch.setattr(workdir_lib.logging, "warning", lambda msg, *a: notes.append(msg % a))
  with workdir_lib.Hold(str(tmp_path)):
    assert json.loads((tmp_path / workdir_lib.HOLD).read_text())["pid"] == os.getpid()
  assert any(f"PID {holder.pid}" in n and "taking it over" in n for n in notes), notes


def test_two_runs_started_together_on_one_workdir_one_is_refused(tmp_path):
  """Before, both trained to the end (the work done twice, every curve logged twice).

  The run that goes on ends with an evaluation of the whole validation split on the suite's
  eight devices (issue 49, point 2: mode=dp there aborted every time, every batch's all-reduce
  dispatched before any result was fetched, one participant never arriving and XLA's 40 s
  rendezvous timeout raising SIGABRT); it finishes with a finite loss."""
  whole_split = "--config.data.final_eval_sequences=0"
  command = proc_helpers.train_command(tmp_path / "run", "--config.steps=200", whole_split)
  logs = [(tmp_path / f"out{i}", tmp_path / f"err{i}") for i in range(2)]
  procs = [
      forked.start(command[1:], dict(os.environ), str(REPO), str(out), err_path=str(err))
      for out, err in logs
  ]
  outs = [(p.wait(300), err.read_text()) for p, (_, err) in zip(procs, logs)]
  codes = sorted(rc for rc, _ in outs)
  assert codes == [0, 2], outs
  refused = next(err for rc, err in outs if rc == 2)
  assert "is in use by another run: PID" in refused and "on host" in refused
  rows = metrics.read_jsonl(str(tmp_path / "run" / metrics.METRICS_FILE))
  steps = [r["step"] for r in rows if "loss" in r]
  assert len(steps) == len(set(steps))  # every step logged once
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["finished"] and math.isfinite(summary["eval_loss"])
