"""LocalCluster.wait bounds a stall, not a run: processes that keep using CPU are waited for past
`timeout_s` (a loaded machine slows a run down), processes that use none end the wait after
`timeout_s`, and STALL_CAP x `timeout_s` ends it whatever they do. Counted in CPU time from /proc,
never against a wall-clock bound."""

import subprocess
import sys

import pytest

from diloco.rpc import local

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {cpu_s}: pass\n"


def _cluster(tmp_path, code: str) -> local.LocalCluster:
  c = local.LocalCluster("unused", 0, str(tmp_path))
  c.procs["p"] = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
  return c


@pytest.fixture
def fast_samples(monkeypatch):
  """Samples every 0.1 s, one clock tick of CPU between two of them counting as work."""
  monkeypatch.setattr(local, "SAMPLE_S", 0.1)
  monkeypatch.setattr(local, "CPU_PROGRESS_S", 0.01)


def test_cpu_seconds_count_a_busy_group_and_not_a_sleeping_one(tmp_path):
  busy = _cluster(tmp_path, BUSY.format(cpu_s=0.5)).procs["p"]
  asleep = _cluster(tmp_path, "import time; time.sleep(30)").procs["p"]
  try:
    assert busy.wait(60) == 0 and local.cpu_seconds({busy.pid}) == 0  # (gone: nothing counted)
    assert local.cpu_seconds({asleep.pid}) < 0.5  # its interpreter's start-up only
    assert local.cpu_seconds(set()) == 0
  finally:
    asleep.kill()


def test_a_working_run_is_waited_for_past_its_timeout(tmp_path, fast_samples, monkeypatch):
  monkeypatch.setattr(local, "STALL_CAP", 10_000)
  c = _cluster(tmp_path, BUSY.format(cpu_s=1.5))  # 1.5 CPU seconds: more than the timeout
  assert c.wait(0.5) == {"p": 0}


def test_a_stalled_run_ends_the_wait(tmp_path, fast_samples):
  c = _cluster(tmp_path, "import time; time.sleep(60)")
  try:
    assert c.wait(0.5) == {"p": None}
  finally:
    c.procs["p"].kill()


def test_the_cap_ends_the_wait_of_a_run_that_never_ends(tmp_path, fast_samples, monkeypatch):
  monkeypatch.setattr(local, "STALL_CAP", 3)
  c = _cluster(tmp_path, "while True: pass")
  try:
    assert c.wait(0.5) == {"p": None}
  finally:
    c.procs["p"].kill()
