"""A Ray cluster on this machine for tests and scripts: start one, run the launcher against it,
read what the run wrote (processes, merges, learner starts) and kill processes by PID."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from diloco.launch import staging
from diloco.rpc import local

AUTH = {"RAY_AUTH_MODE": "token"}  # `ray start` enables token auth; drivers must say so too


def ray_bin() -> str:
  return os.path.join(os.path.dirname(sys.executable), "ray")


def env(devices: int = 1, jax_cache: str = "") -> dict:
  """The environment of the cluster's processes: JAX on this CPU, the repository importable; with
  `jax_cache`, compiled programs persist there, so a restarted process does not compile again."""
  cache = {}
  if jax_cache:
    cache = dict(
        JAX_COMPILATION_CACHE_DIR=jax_cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
  return dict(
      os.environ,
      **AUTH,
      **cache,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
      PYTHONPATH=staging.REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
  )


@contextlib.contextmanager
def cluster(num_cpus: int = 4, temp_dir: str = "", jax_cache: str = ""):
  """A head node started with `ray start` (stopped at the end); yields its address. Its workers
  inherit env(jax_cache=jax_cache)."""
  port = local.free_port()
  args = [ray_bin(), "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}"]
  args += ["--include-dashboard=false", "--disable-usage-stats"]
  args += [f"--temp-dir={temp_dir}"] if temp_dir else []
  subprocess.run(args, env=env(jax_cache=jax_cache), check=True, capture_output=True, timeout=120)
  try:
    yield f"127.0.0.1:{port}"
  finally:
    subprocess.run([ray_bin(), "stop", "--force"], env=env(), capture_output=True, timeout=120)


def launch(address: str, config: str, learners: int, workdir: str, *flags: str, log: str = ""):
  """experiments.launch_ray against `address`, as a background process (its output to `log`)."""
  out = open(log or os.devnull, "ab")
  cmd = [sys.executable, "-m", "experiments.launch_ray", f"--config={config}"]
  cmd += [f"--learners={learners}", f"--workdir={workdir}", f"--address={address}", *flags]
  proc = subprocess.Popen(cmd, cwd=staging.REPO, env=env(), stdout=out, stderr=subprocess.STDOUT)
  out.close()
  return proc


def rows(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def state(workdir: str) -> dict:
  """WORKDIR/ray_state.json as the driver last wrote it ({} before its first write)."""
  try:
    with open(os.path.join(workdir, "ray_state.json")) as f:
      return json.load(f)
  except FileNotFoundError:
    return {}


def merges(workdir: str) -> list[dict]:
  """{time (wall), learners} of every merge the synchronizer logged."""
  return [
      {"time": r["wall_time"], "learners": r["learners"]}
      for r in rows(os.path.join(workdir, "sync", "metrics.jsonl"))
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
