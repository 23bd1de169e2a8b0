"""A run stopped by SIGTERM (a preemption notice) or `stop_after_steps` saves a checkpoint at the
next step boundary, exits with EXIT_PREEMPTED on a signal, and the same command resumes to the
bits of an uninterrupted run."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

from configs import shakespeare
from diloco import metrics, train
from diloco.inner import manifest
from diloco.rpc import forked
from diloco.runtime import preemption, virtual_snapshot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 200  # a signal sent at the first rows lands mid-run (about 5 s before the end here)
RUNS = {
    "dp": ("runlocal", {"steps": STEPS, "log_every": 1}),
    "decoupled": ("runlocal,mode=decoupled", {"steps": STEPS, "log_every": 1}),
}


def _config(mode: str, **overrides):
  variants, values = RUNS[mode]
  config = shakespeare.get_config(variants)
  with config.unlocked():
    config.update_from_flattened_dict({**values, **overrides})
  return config


def _command(mode: str, workdir) -> list[str]:
  variants, values = RUNS[mode]
  flags = [f"--config.{k}={v}" for k, v in values.items()]
  config = f"--config=configs/shakespeare.py:{variants}"
  return [sys.executable, "-m", "experiments.train", config, f"--workdir={workdir}", *flags]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """One uninterrupted run per mode (in this process), made when a test first asks for it."""
  done: dict[str, tuple[dict, str]] = {}

  def get(mode: str) -> tuple[dict, str]:
    if mode not in done:
      workdir = str(tmp_path_factory.mktemp(f"full_{mode}"))
      done[mode] = (train.train_and_evaluate(_config(mode), workdir), workdir)
    return done[mode]

  return get


def _merges(workdir) -> list[dict]:
  rows = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
  return [r for r in rows if r.get("event") == "merge"]


def _orbax_tmp(workdir) -> list[str]:
  return [d for d, _, _ in os.walk(workdir) if "orbax-checkpoint-tmp" in d]


def _sigterm_mid_run(mode: str, workdir, log_path) -> tuple[int, dict]:
  """Starts the main, sends SIGTERM once it has logged a training row; (exit code, summary)."""
  proc = forked.start(_command(mode, workdir)[1:], dict(os.environ), REPO, str(log_path))
  rows, deadline = workdir / metrics.METRICS_FILE, time.monotonic() + 300
  while not (rows.exists() and '"loss"' in rows.read_text()):
    assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)
  rc = proc.wait(300)
  return rc, json.loads((workdir / metrics.SUMMARY_FILE).read_text())


def _finish(mode: str, workdir) -> dict:
  proc = forked.run(_command(mode, workdir)[1:], dict(os.environ), REPO, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads((workdir / metrics.SUMMARY_FILE).read_text())


BLOCKED = """
import time
from diloco.runtime import preemption
with preemption.stop_on_signals(grace_s=1.0):
  print("blocked", flush=True)
  time.sleep(120)  # as a collective waiting for a dead peer: no boundary asks for the request
"""


def test_a_run_that_reaches_no_boundary_after_sigterm_ends_with_one_line_and_75():
  """Before: a process blocked in a collective or a save's barrier logged the first SIGTERM
  ("stopping at the next step boundary") and went on waiting; only SIGKILL ended it."""
  proc = subprocess.Popen([sys.executable, "-c", BLOCKED], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
  assert proc.stdout.readline() == "blocked\n"
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)  # (the sleep alone would take 120 s)
  assert proc.returncode == preemption.EXIT_PREEMPTED, err
  lines = [l for l in err.splitlines() if l.startswith("error: ")]
  assert lines == [
      "error: got SIGTERM 1 s ago and reached no step boundary since (blocked in a collective or "
      "a save?): exiting with 75 without a new checkpoint; the same command resumes from the "
      "last one"
  ]


def test_a_signal_requests_a_stop_and_a_second_one_interrupts():
  before = signal.getsignal(signal.SIGTERM)
  with preemption.stop_on_signals():
    assert not preemption.requested()
    os.kill(os.getpid(), signal.SIGTERM)
    assert preemption.requested()
    assert preemption.stop_reason(3, stop_at=None) == preemption.SIGNAL
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGTERM) is before
  with preemption.stop_on_signals():  # a new run starts with no request
    assert preemption.stop_reason(3, stop_at=4) is None
    assert preemption.stop_reason(4, stop_at=4) == preemption.STOP_AFTER_STEPS
  assert preemption.exit_code({"stopped_by": "signal"}) == preemption.EXIT_PREEMPTED == 75
  assert preemption.exit_code({"stopped_by": "stop_after_steps", "finished": False}) == 0


def test_orbax_temporaries_are_removed_and_a_failed_snapshot_keeps_the_last(tmp_path):
  tmp = tmp_path / "checkpoints" / "learner0" / "7.orbax-checkpoint-tmp-1234"
  tmp.mkdir(parents=True)
  (tmp.parent / "5").mkdir()
  assert preemption.remove_orbax_tmp(str(tmp_path)) == [str(tmp)]
  assert sorted(os.listdir(tmp.parent)) == ["5"]
  target = virtual_snapshot.save(str(tmp_path), {"step": 1})
  with pytest.raises((pickle.PicklingError, AttributeError)):
    virtual_snapshot.save(str(tmp_path), {"step": 2, "unpicklable": lambda: 0})
  with open(target, "rb") as f:
    assert pickle.load(f) == {"step": 1}
  assert sorted(os.listdir(os.path.dirname(target))) == ["learner0", virtual_snapshot.FILE]


def test_sigterm_stops_dp_with_a_checkpoint_and_the_rerun_has_the_same_bits(
    tmp_path, uninterrupted
):
  rc, part = _sigterm_mid_run("dp", tmp_path / "run", tmp_path / "child.log")
  assert rc == preemption.EXIT_PREEMPTED, (tmp_path / "child.log").read_text()[-3000:]
  assert part["finished"] is False and part["stopped_by"] == "signal"
  assert 0 < part["steps"] < STEPS
  assert str(part["steps"]) in os.listdir(tmp_path / "run" / "checkpoints")
  assert not _orbax_tmp(tmp_path / "run")
  rest = _finish("dp", tmp_path / "run")
  full, _ = uninterrupted("dp")
  assert rest["finished"] and rest["resumed_from_step"] == part["steps"]
  assert rest["params_sha256"] == full["params_sha256"]


def test_sigterm_stops_decoupled_with_a_snapshot_and_the_rerun_has_the_same_merges(
    tmp_path, uninterrupted
):
  workdir = tmp_path / "run"
  rc, part = _sigterm_mid_run("decoupled", workdir, tmp_path / "child.log")
  assert rc == preemption.EXIT_PREEMPTED, (tmp_path / "child.log").read_text()[-3000:]
  assert part["finished"] is False and part["stopped_by"] == "signal" and part["resumable"]
  assert 0 < part["step"] < STEPS and part["merges"] == len(_merges(workdir))
  assert os.path.exists(virtual_snapshot.path(str(workdir)))
  assert not _orbax_tmp(workdir)
  rest = _finish("decoupled", workdir)
  full, full_dir = uninterrupted("decoupled")
  assert rest["finished"] and rest["merges"] == full["merges"] > part["merges"]
  assert _merges(workdir) == _merges(full_dir)
  assert rest["params_sha256"] == full["params_sha256"]
  assert not os.path.exists(virtual_snapshot.path(str(workdir)))  # finished: nothing to resume


def test_a_stopped_mode_stops_compare_before_the_next_mode(tmp_path):
  config = shakespeare.get_config("runlocal,mode=compare")
  with config.unlocked():
    config.stop_after_steps = 5
  summary = train.train_and_evaluate(config, str(tmp_path))
  assert summary["finished"] is False and summary["stopped_in"] == "dp"
  assert list(summary["runs"]) == ["dp"] and summary["runs"]["dp"]["steps"] == 5
  assert sorted(os.listdir(tmp_path)) == ["config.json", "dp", "summary.json"]


def test_a_run_with_faults_stops_on_a_signal_without_a_snapshot(tmp_path):
  config = shakespeare.get_config("runlocal,mode=decoupled,chaos=light")
  with preemption.stop_on_signals():  # the signal came while the run was setting up
    os.kill(os.getpid(), signal.SIGTERM)
    summary = train.train_and_evaluate(config, str(tmp_path))
  assert summary["finished"] is False and summary["stopped_by"] == "signal"
  assert summary["resumable"] is False and summary["steps"] == 1  # after its first event
  assert not os.path.exists(virtual_snapshot.path(str(tmp_path)))
  assert not _orbax_tmp(tmp_path)


def test_kill_9_between_saves_resumes_from_the_newest_committed_save(tmp_path):
  """Issue 49, point 1: SIGKILL after step 70 with saves every 50 steps. Before, the save of step
  50 had no manifest yet (written at the next save), was set aside as corrupt and the rerun began
  at step 0; now the manifest is written when orbax commits, and the rerun resumes at step 50."""
  workdir = tmp_path / "run"
  command = _command("dp", workdir) + ["--config.checkpoint_every=50"]
  proc = forked.start(command[1:], dict(os.environ), REPO, str(tmp_path / "log"))
  rows, deadline = workdir / metrics.METRICS_FILE, time.monotonic() + 300
  # Killed once step 70 has run and the save of step 50 has its manifest (written when orbax
  # commits it; before, only at the next save): a CI run of a loaded suite had killed it at step
  # 70 before that save had committed, and the rerun began at 0.
  sealed = workdir / "checkpoints" / "50" / manifest.NAME
  while not (
      rows.exists() and any(r.get("step", 0) >= 70 for r in _rows(rows)) and sealed.exists()
  ):
    assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
    time.sleep(0.02)
  proc.kill()
  proc.wait(60)
  assert proc.returncode == -signal.SIGKILL
  rerun = forked.run(command[1:], dict(os.environ), REPO, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  summary = json.loads((workdir / metrics.SUMMARY_FILE).read_text())
  assert summary["resumed_from_step"] >= 50 and summary["finished"]
  assert not [n for n in os.listdir(workdir / "checkpoints") if ".corrupt-" in n]


def _rows(path) -> list[dict]:
  out = []
  for line in path.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except ValueError:  # a row being written
      pass
  return out


@pytest.mark.parametrize("delivery", ["rebase", "at_own_sync"])
def test_a_stopped_run_under_a_keeping_rule_resumes_to_the_same_bits(tmp_path, delivery):
  """Issue 51: the snapshot keeps what the delivery rules read (the uploads not yet answered,
  the bases at_own_sync trains from), so a resumed run is the uninterrupted one."""
  config = _config("decoupled", steps=60, stop_after_steps=17)
  with config.unlocked():
    config.outer.delivery = delivery
  part = train.train_and_evaluate(config, str(tmp_path / "part"))
  assert part["stopped_by"] == "stop_after_steps"
  with config.unlocked():
    config.stop_after_steps = 0
  rest = train.train_and_evaluate(config, str(tmp_path / "part"))
  full = train.train_and_evaluate(config, str(tmp_path / "full"))
  assert rest["params_sha256"] == full["params_sha256"] and rest["eval_loss"] == full["eval_loss"]
  assert rest["merged_share"] == full["merged_share"] > 0
