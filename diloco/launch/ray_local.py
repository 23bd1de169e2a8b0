"""A Ray cluster on this machine for tests and scripts: start one, run the launcher against it,
read what the run wrote (processes, merges, learner starts) and kill processes by PID."""

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time

from diloco import jsonl
from diloco.launch import staging
from diloco.rpc import local

AUTH = {"RAY_AUTH_MODE": "token"}  # `ray start` enables token auth; drivers must say so too
_TOKEN_PATHS: dict[str, str] = {}  # address -> the token file of a cluster started here


def ray_bin() -> str:
  return os.path.join(os.path.dirname(sys.executable), "ray")


def env(devices: int = 1, jax_cache: str = "", token_path: str = "") -> dict:
  """The environment of the cluster's processes: JAX on this CPU, the repository importable; with
  `jax_cache`, compiled programs persist there, so a restarted process does not compile again;
  with `token_path`, Ray's token is read from that file."""
  extra = {"RAY_AUTH_TOKEN_PATH": token_path} if token_path else {}
  if jax_cache:
    extra.update(
        JAX_COMPILATION_CACHE_DIR=jax_cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
  return dict(
      os.environ,
      **AUTH,
      **extra,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=local.xla_flags(devices),
      PYTHONPATH=staging.REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
  )


@contextlib.contextmanager
def cluster(num_cpus: int = 4, temp_dir: str = "", jax_cache: str = ""):
  """A head node started with `ray start` (stopped at the end); yields its address. Its workers
  inherit env(jax_cache=jax_cache). Ray's token authentication needs a token: a fresh one is
  written (mode 600) for this cluster alone, whatever ~/.ray holds, and `launch` hands it on."""
  port = local.free_port()
  address = f"127.0.0.1:{port}"
  args = [ray_bin(), "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}"]
  args += ["--include-dashboard=false", "--disable-usage-stats"]
  args += [f"--temp-dir={temp_dir}"] if temp_dir else []
  with tempfile.TemporaryDirectory(prefix="diloco-ray-") as secret_dir:
    token_path = os.path.join(secret_dir, "auth_token")
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
      f.write(secrets.token_hex(32))
    _TOKEN_PATHS[address] = token_path
    cluster_env = env(jax_cache=jax_cache, token_path=token_path)
    try:
      result = subprocess.run(args, env=cluster_env, capture_output=True, text=True, timeout=120)
      if result.returncode:
        raise RuntimeError(f"`ray start` failed ({result.returncode}): {result.stderr[-2000:]}")
      yield address
    finally:
      subprocess.run(
          [ray_bin(), "stop", "--force"], env=cluster_env, capture_output=True, timeout=120
      )
      _TOKEN_PATHS.pop(address, None)


def launch(address: str, config: str, learners: int, workdir: str, *flags: str, log: str = ""):
  """experiments.launch_ray against `address`, as a background process (its output to `log`)."""
  out = open(log or os.devnull, "ab")
  cmd = [sys.executable, "-m", "experiments.launch_ray", f"--config={config}"]
  cmd += [f"--learners={learners}", f"--workdir={workdir}", f"--address={address}", *flags]
  proc_env = env(token_path=_TOKEN_PATHS.get(address, ""))
  proc = subprocess.Popen(cmd, cwd=staging.REPO, env=proc_env, stdout=out, stderr=subprocess.STDOUT)
  out.close()
  return proc


def rows(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  return jsonl.read(path)


def state(workdir: str) -> dict:
  """WORKDIR/ray_state.json as the driver last wrote it ({} before its first write)."""
  try:
    with open(os.path.join(workdir, "ray_state.json")) as f:
      return json.load(f)
  except FileNotFoundError:
    return {}


def merges(workdir: str, role: str = "sync") -> list[dict]:
  """{time (wall), learners, fragment} of every merge the synchronizer (or shard `role`,
  sync<s>) logged."""
  return [
      {"time": r["wall_time"], "learners": r["learners"], "fragment": r["fragment"]}
      for r in rows(os.path.join(workdir, role, "metrics.jsonl"))
      if r.get("event") == "merge"
  ]


def starts(workdir: str, learners: int) -> dict[int, list[float]]:
  return {
      m: [r["time"] for r in rows(os.path.join(workdir, f"learner{m}", "starts.jsonl"))]
      for m in range(learners)
  }


def kill(workdir: str, role: str) -> dict:
  """SIGKILLs the current process of `role` (from ray_state.json); the kill's record."""
  pid = state(workdir)["procs"][role]["pid"]
  os.kill(pid, signal.SIGKILL)
  return {"time": time.time(), "process": role, "pid": pid}


def wait_for(what, timeout_s: float, poll_s: float = 0.2, proc=None):
  """Polls `what()` until it returns something true (then returns it); TimeoutError otherwise,
  or RuntimeError if `proc` (the launcher) exits first."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    value = what()
    if value:
      return value
    if proc is not None and proc.poll() is not None:
      raise RuntimeError(f"the launcher exited with {proc.returncode} while waiting")
    time.sleep(poll_s)
  raise TimeoutError(f"not reached in {timeout_s} s: {getattr(what, '__doc__', what)}")
