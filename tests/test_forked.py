"""diloco/rpc/forked.py: an entry module started as a fork of the preloaded server behaves as a
fresh interpreter would: its exit code, its environment, directory and session, its log, its
threads and atexit handlers at the end, and a signal's death."""

import os
import signal
import subprocess
import textwrap

import proc_helpers
import pytest

from diloco.rpc import forked, local

# A module run as __main__: it reports what it sees, then ends as its first argument says.
PROBE = textwrap.dedent("""
    import atexit, os, sys, threading, time

    print("argv", sys.argv[1:], "name", __name__)
    print("env", os.environ.get("PROBE_VALUE"), "cwd", os.getcwd())
    print("session", os.getsid(0) == os.getpid(), "jax", "jax" in sys.modules, flush=True)
    atexit.register(lambda: print("atexit ran", flush=True))
    how = sys.argv[1]
    if how == "thread":  # a non-daemon thread outlives the module; the exit waits for it
      threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
    elif how == "exit":
      sys.exit(int(sys.argv[2]))
    elif how == "raise":
      raise ValueError("the probe failed")
    elif how == "sleep":
      open(sys.argv[2], "w").close()
      time.sleep(600)
    """)


@pytest.fixture
def probe(tmp_path, monkeypatch):
  # This process's environment as the server's where it is read at import: the server is this
  # worker's, perhaps started by an earlier test in another environment.
  forked.ensure_server(dict(os.environ))
  for k in list(os.environ):
    if k.startswith(forked.IMPORT_TIME) and k != "PYTHONPATH":
      monkeypatch.delenv(k)
  for k, v in forked.server_environment().items():
    monkeypatch.setenv(k, v)
  (tmp_path / "probe_pkg").mkdir()
  (tmp_path / "probe_pkg" / "__init__.py").write_text("")
  (tmp_path / "probe_pkg" / "probe.py").write_text(PROBE)
  work = tmp_path / "work"
  work.mkdir()
  env = dict(os.environ, PYTHONPATH=str(tmp_path), PROBE_VALUE="seven")

  def start(*args, env=env):
    log = tmp_path / f"log{len(list(tmp_path.glob('log*')))}"
    return forked.Forked("probe_pkg.probe", list(args), env, str(work), str(log)), log

  return start, work


def test_a_fork_sees_its_own_argv_environment_directory_and_session(probe):
  start, work = probe
  proc, log = start("exit", "0")
  assert proc.wait(60) == 0
  lines = log.read_text().splitlines()
  assert lines[:3] == [
      "argv ['exit', '0'] name __main__",
      f"env seven cwd {work}",
      "session True jax True",  # (the server's imports: the fork starts with them)
  ]
  assert lines[3:] == ["atexit ran"]


def test_exit_codes_exceptions_and_threads_end_as_an_interpreters_would(probe):
  start, _ = probe
  exited, _ = start("exit", "75")
  failed, failed_log = start("raise")
  threaded, threaded_log = start("thread")
  assert exited.wait(60) == 75
  assert failed.wait(60) == 1
  assert "ValueError: the probe failed" in failed_log.read_text()
  assert "atexit ran" in failed_log.read_text()
  assert threaded.wait(60) == 0
  # The exit joined the thread before the atexit handlers, as the interpreter's own does.
  assert threaded_log.read_text().splitlines()[-2:] == ["thread done", "atexit ran"]


def test_a_signal_ends_the_fork_with_its_negative_code_and_its_group_is_its_own(probe, tmp_path):
  start, _ = probe
  ready = tmp_path / "ready"
  proc, _ = start("sleep", str(ready))
  proc_helpers.wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "the probe")
  assert proc.poll() is None and proc.returncode is None
  os.killpg(proc.pid, signal.SIGKILL)  # as LocalCluster.kill does: the process's own group
  assert proc.wait(60) == -signal.SIGKILL


def test_a_cluster_forks_unless_the_import_time_environment_differs(probe, tmp_path, monkeypatch):
  start, _ = probe
  assert start("exit", "0")[0].wait(60) == 0  # (the server runs, in this environment)
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # (the probe, for the cluster's processes)
  cluster = local.LocalCluster("configs/shakespeare.py", 1, str(tmp_path / "run"))
  same = cluster._spawn("a", ["-m", "probe_pkg.probe", "exit", "3"], 1)
  monkeypatch.setenv("JAX_ENABLE_X64", "1")  # read by JAX at import: the server's differs
  fresh = cluster._spawn("b", ["-m", "probe_pkg.probe", "exit", "4"], 1)
  assert isinstance(same, forked.Forked) and isinstance(fresh, subprocess.Popen)
  assert (same.wait(60), fresh.wait(60)) == (3, 4)
  logs = tmp_path / "run" / "logs"
  assert "jax True" in (logs / "a.log").read_text()  # the fork began with JAX imported
  assert "jax False" in (logs / "b.log").read_text()  # a fresh interpreter had not
