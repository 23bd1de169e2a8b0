"""Entry modules (`python -m experiments.learner ...`) started as forks of one process that has
already imported the library: multiprocessing's forkserver, with the learner's and the
synchronizer's modules preloaded.

A fresh learner process spends about 4 s of CPU importing JAX, flax, orbax and grain before it
does anything (`python -X importtime -c "import experiments.learner"`); a fork of the server
starts with them imported, so a crashed learner's restart, and each process of a local cluster,
begins at once. The fork is a new process like any other: its own pid and session, its own
environment, working directory and log, signals and exit codes as a fresh interpreter's, the
interpreter's exit (threads joined, then atexit handlers) at its end.

What a fork cannot take anew is what the preloaded libraries read from the environment at
import (JAX's configuration from JAX_*, Python's PYTHON* settings, ...): a start whose values of
those differ from the server's is not forked but started fresh (`compatible`). Nor does a fork
see a source file edited since the server imported it: a launcher that must run edited code
starts fresh interpreters (`LocalCluster(fork=False)`).
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from multiprocessing import forkserver

from diloco.rpc import netns as netns_lib

# The modules the entry points import, so that the server holds them: the learner's, the
# synchronizer's and the main's (with JAX, flax, optax, orbax, grain, gRPC).
PRELOAD = (
    "diloco.rpc.learner_main",
    "diloco.rpc.sync_main",
    "diloco.rpc.multihost",
    "diloco.train",
)
# Variables read at import by what the server preloads: JAX's config flags, Python itself, the
# C++ logging level of the XLA library jaxlib loads, the math libraries' thread pools, numba's
# config, gRPC's core, the dynamic loader. A start must have the server's values of every one of
# them to be forked. Read later, in the fork, and so free to differ: XLA_FLAGS and XLA_PYTHON_*
# (when a process first makes its devices), TPU_* (libtpu's, when a TPU backend starts; the
# suite's plans set some in the test process), DILOCO_*; PYTHONPATH is put on the fork's sys.path.
IMPORT_TIME = (
    "JAX_", "PYTHON", "TF_CPP_", "NUMBA_", "GRPC_", "OMP_", "OPENBLAS_", "MKL_", "LD_",
)  # fmt: skip
_RUNTIME = {"PYTHONPATH"}
# What an import sets where unset (jax/__init__.py's default C++ log level): unset is that value.
_SET_BY_IMPORT = {"TF_CPP_MIN_LOG_LEVEL": "1"}

_server_env: dict[str, str] | None = None
_lock = threading.Lock()


def _import_time(env: dict[str, str]) -> dict[str, str]:
  picked = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in _RUNTIME}
  return _SET_BY_IMPORT | picked


def compatible(env: dict[str, str]) -> bool:
  """Whether a process with environment `env` can be a fork of the server (started, with `env`'s
  import-time values, by the first start)."""
  return _server_env is None or _import_time(env) == _server_env


def server_environment() -> dict[str, str] | None:
  """The import-time variables the server started with (None: no server yet)."""
  return None if _server_env is None else dict(_server_env)


def ensure_server(env: dict[str, str]) -> None:
  """Starts the server once, in `env`'s import-time environment (this process's own otherwise)."""
  global _server_env
  with _lock:
    if _server_env is not None:
      return
    wanted = _import_time(env)
    saved = {k: os.environ.get(k) for k in set(wanted) | set(_import_time(dict(os.environ)))}
    os.environ.update(wanted)
    for k in set(saved) - set(wanted):
      os.environ.pop(k, None)
    try:
      forkserver.set_forkserver_preload(list(PRELOAD))
      forkserver.ensure_running()
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v
    _server_env = wanted


class Forked:
  """A forked entry module, as much of subprocess.Popen's interface as the launchers use."""

  def __init__(
      self,
      module: str,
      args: list[str],
      env: dict,
      cwd: str,
      log_path: str,
      netns: str = "",
      err_path: str = "",
  ):
    """Its stdout appended to `log_path`, its stderr too (or to `err_path`); `netns`: the name
    of the network namespace to run in (as `ip netns exec NAME` would)."""
    ensure_server(env)
    self.args = [sys.executable, "-m", module, *args]
    ctx = multiprocessing.get_context("forkserver")
    paths = (log_path, err_path or log_path)
    self._process = ctx.Process(
        target=_run, args=(module, list(args), dict(env), cwd, paths, netns), daemon=False
    )
    self._process.start()
    self.pid = self._process.pid

  def poll(self) -> int | None:
    return self._process.exitcode

  @property
  def returncode(self) -> int | None:
    return self.poll()

  def wait(self, timeout: float | None = None) -> int:
    self._process.join(timeout)
    if self._process.exitcode is None:
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self._process.exitcode

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, sig)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


def start(
    argv: list[str],
    env: dict,
    cwd: str,
    log_path: str,
    netns: str = "",
    err_path: str = "",
    fork: bool = True,
) -> Forked | subprocess.Popen:
  """`python ARGV` in its own session, its output appended to `log_path` (stderr to `err_path`,
  if given): a fork where ARGV is `-m MODULE ...` and `env` is `compatible` (and `fork`), else a
  fresh interpreter (through `ip netns exec` for a `netns`)."""
  if fork and argv[0] == "-m" and compatible(env):
    return Forked(argv[1], argv[2:], env, cwd, log_path, netns, err_path)
  prefix = netns_lib.exec_prefix(netns) if netns else []
  with open(log_path, "ab") as out, open(err_path or os.devnull, "ab") as err:
    return subprocess.Popen(
        [*prefix, sys.executable, *argv],
        cwd=cwd,
        env=env,
        stdout=out,
        stderr=err if err_path else subprocess.STDOUT,
        start_new_session=True,
    )


def run(argv: list[str], env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
  """`python ARGV` to its end, as subprocess.run(capture_output=True, text=True) would: started
  by `start`, its stdout and stderr read back; killed with its session past `timeout`."""
  with tempfile.TemporaryDirectory(prefix="diloco-forked-") as tmp:
    out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    proc = start(argv, env, cwd, out, err_path=err)
    try:
      code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
      raise
    with (
        open(out, encoding="utf-8", errors="replace") as o,
        open(err, encoding="utf-8", errors="replace") as e,
    ):
      return subprocess.CompletedProcess([sys.executable, *argv], code, o.read(), e.read())


def _run(module: str, args: list[str], env: dict, cwd: str, paths: tuple, netns: str) -> None:
  """In the fork: a new session (in its network namespace), its stdout and stderr files, the
  start's environment and directory, then the module as __main__ and the interpreter's own end
  (never returns)."""
  os.setsid()
  if netns:
    _enter_netns(netns)
  for target, path in zip((1, 2), paths):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, target)
    os.close(fd)
  os.chdir(cwd)
  os.environ.clear()
  os.environ.update(env)
  sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
  sys.argv = [module, *args]
  code = 0
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  # The interpreter's end: non-daemon threads joined, then the atexit handlers, then the streams.
  threading._shutdown()  # pylint: disable=protected-access
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(code)


_CLONE_NEWNET = 0x40000000


def _enter_netns(name: str) -> None:
  """setns(2) into the named network namespace (/run/netns/NAME, where `ip netns add` puts it)."""
  fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.setns(fd, _CLONE_NEWNET) != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
  os.close(fd)
