"""Start, kill and restart a synchronizer and M learner processes on this machine.

Used by scripts/launch_local.py, scripts/chaos_local.py and the tests. Every process writes its log
to WORKDIR/logs/<name>.log (appended across restarts); the synchronizer binds 127.0.0.1 (with a
`network`, its namespace's address: every process then runs in its own host's namespace,
diloco/rpc/netns.py) on a port it picks itself and writes to WORKDIR/sync/port, which the
learners are then pointed at (with
`shards` S > 1, S synchronizer processes sync0..sync{S-1}, each in its own WORKDIR/sync<s>, and
every learner is pointed at all of them). Settings
of the deployment reach every process as --config.deploy.KEY=VALUE overrides (`overrides`). With
`processes_per_learner` > 1 each learner is one JAX job of that many local processes (process 0,
named learner<m>, talks to the synchronizer; learner<m>.p<i> follow it), meeting at a coordinator
on a free loopback port.
"""

import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from diloco import paths
from diloco.rpc import forked

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class LocalCluster:
  """Processes of one local run; `config` is the --config argument (file[:args])."""

  config: str
  learners: int
  workdir: str
  overrides: tuple[str, ...] = ()  # extra --config.key=value flags for every process
  devices_per_learner: int = 1  # per process
  processes_per_learner: int = 1
  processes_of: dict = dataclasses.field(default_factory=dict)  # m -> its processes, if not that
  token: str = dataclasses.field(default_factory=lambda: secrets.token_hex(16))
  absent_after_s: float = 3.0
  procs: dict = dataclasses.field(default_factory=dict)
  port: int | None = None
  starts: dict = dataclasses.field(default_factory=dict)
  shards: int = 1  # outer.sync_shards: synchronizer processes
  ports: dict = dataclasses.field(default_factory=dict)  # shard -> its port
  # A `netns.Network` whose hosts are named like the processes (sync, learner0, ...): each runs
  # in its host's namespace, the synchronizer bound to its address; None: all on loopback.
  network: Any = None
  # Start each process as a fork of one server that has imported the library (diloco/rpc/forked.py):
  # ~4 s less CPU a start. A process whose environment differs from the server's where the
  # libraries read it at import starts as a fresh interpreter.
  fork: bool = True
  _local_logs: str | None = None

  def sync_name(self, shard: int = 0) -> str:
    """The process (and workdir) name of synchronizer shard `shard`: sync, or sync<s>."""
    return "sync" if self.shards == 1 else f"sync{shard}"

  def _shard_args(self) -> list[str]:
    return [] if self.shards == 1 else [f"--config.outer.sync_shards={self.shards}"]

  def _env(self, devices: int) -> dict:
    env = dict(
        os.environ,
        DILOCO_TOKEN=self.token,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=xla_flags(devices),
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    return env

  def address(self, host: str) -> str:
    """Where `host` (a process name) is reached: its namespace's address, or loopback."""
    return self.network.address(host) if self.network is not None else "127.0.0.1"

  def _bind_args(self, name: str) -> list[str]:
    return [] if self.network is None else [f"--config.deploy.bind={self.address(name)}"]

  @property
  def logs(self) -> str:
    """The processes' logs: WORKDIR/logs, or a local directory when the workdir is a bucket's
    (a process's output goes to a local file)."""
    if paths.is_local(self.workdir):
      return os.path.join(self.workdir, "logs")
    if self._local_logs is None:
      self._local_logs = tempfile.mkdtemp(prefix="diloco-logs-")
    return self._local_logs

  def _spawn(self, name: str, args: list[str], devices: int) -> subprocess.Popen | forked.Forked:
    os.makedirs(self.logs, exist_ok=True)
    log_path = os.path.join(self.logs, f"{name}.log")
    env = self._env(devices)
    host = name.split(".")[0]  # (learner<m>.p<i> runs on learner<m>'s host)
    netns = self.network.ns[host] if self.network is not None else ""
    proc = forked.start([*args, *self.overrides], env, REPO, log_path, netns, fork=self.fork)
    self.procs[name] = proc
    self.starts[name] = self.starts.get(name, 0) + 1
    return proc

  def start_sync(self, timeout_s: float = 120.0, shard: int = 0) -> int:
    """Starts (or restarts) the synchronizer (shard `shard`) and waits for its port."""
    name = self.sync_name(shard)
    sync_dir = paths.join(self.workdir, name)
    port_file = paths.join(sync_dir, "port")
    paths.remove(port_file)
    port = self.ports.get(shard, 0)  # a restart reuses the port the learners know
    shard_flag = [] if self.shards == 1 else [f"--shard={shard}"]
    proc = self._spawn(
        name,
        [
            "-m",
            "experiments.synchronizer",
            f"--config={self.config}",
            f"--workdir={sync_dir}",
            f"--config.deploy.port={port}",
            f"--config.deploy.absent_after_s={self.absent_after_s}",
            *self._bind_args(name),
            *shard_flag,
            *self._shard_args(),
        ],
        1,
    )
    deadline = time.monotonic() + timeout_s
    while not paths.exists(port_file):
      if proc.poll() is not None:
        raise RuntimeError(
            f"synchronizer exited with {proc.returncode}; see {self.logs}/{name}.log"
        )
      if time.monotonic() > deadline:
        raise TimeoutError(f"{name} did not write its port in time")
      time.sleep(0.1)
    self.ports[shard] = int(paths.read_text(port_file))
    self.port = self.ports[0] if 0 in self.ports else None
    return self.ports[shard]

  def learner_names(self, m: int) -> list[str]:
    """The process names of learner m: learner<m>, then its followers learner<m>.p<i>."""
    n = self.processes_of.get(m, self.processes_per_learner)
    return [f"learner{m}"] + [f"learner{m}.p{i}" for i in range(1, n)]

  def start_learner(self, m: int) -> subprocess.Popen:
    """Starts (or restarts) every process of learner m; returns its process 0."""
    if len(self.ports) < self.shards:
      raise ValueError("start the synchronizer (every shard) first")
    targets = ",".join(
        f"{self.address(self.sync_name(s))}:{self.ports[s]}" for s in range(self.shards)
    )
    args = [
        "-m",
        "experiments.learner",
        f"--config={self.config}",
        f"--learner_id={m}",
        f"--synchronizer={targets}",
        f"--workdir={paths.join(self.workdir, f'learner{m}')}",
        f"--config.deploy.absent_after_s={self.absent_after_s}",
        *self._shard_args(),
    ]
    n = len(self.learner_names(m))
    if n == 1:
      return self._spawn(f"learner{m}", args, self.devices_per_learner)
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [
        self._spawn(
            name,
            args + [f"--coordinator={coordinator}", f"--num_processes={n}", f"--process_id={i}"],
            self.devices_per_learner,
        )
        for i, name in enumerate(self.learner_names(m))
    ]
    return procs[0]

  def start(self) -> None:
    for shard in range(self.shards):
      self.start_sync(shard=shard)
    for m in range(self.learners):
      self.start_learner(m)

  def kill(self, name: str) -> None:
    """SIGKILL, as a crash would; no cleanup runs in the process. Killing learner<m> kills
    every process of that learner (one JAX job does not outlive its process 0)."""
    names = [n for n in self.procs if n == name or n.startswith(name + ".p")]
    for n in names:
      proc = self.procs[n]
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

  def freeze(self, name: str) -> None:
    """SIGSTOP to the process and its children: it stops mid-whatever, its sockets stay open."""
    os.killpg(self.procs[name].pid, signal.SIGSTOP)

  def thaw(self, name: str) -> None:
    os.killpg(self.procs[name].pid, signal.SIGCONT)

  def leave(self, name: str) -> None:
    """Tells learner `name` to finish now: it delivers what it holds, settles and exits 0
    (learner_main.LEAVE_SIGNAL)."""
    from diloco.rpc import learner_main  # (a JAX program: imported only when asked)

    self.procs[name].send_signal(learner_main.LEAVE_SIGNAL)

  def alive(self, name: str) -> bool:
    return name in self.procs and self.procs[name].poll() is None

  def wait(self, timeout_s: float, restart_crashed: bool = False) -> dict[str, int | None]:
    """Waits for every process to exit by itself; returns their exit codes (None: running).

    `timeout_s` bounds a stall, not the run: the wait ends once the processes have gone
    `timeout_s` without using CPU_PROGRESS_S of CPU between two samples (hung, or waiting on each
    other), and at most after STALL_CAP x `timeout_s` in all, so that a run slowed down by a
    loaded machine is not taken for a hung one (on a system without /proc: `timeout_s` in all).

    With `restart_crashed`, a learner one of whose processes crashed (exited with
    learner_faults.CRASH_EXIT, a chaos `crash` fault, or was killed by a signal) is started again
    at once, as a supervisor would: every process of a multi-process learner, as one JAX job does
    not outlive one of its processes (the others would wait in a collective), each resuming from
    the learner's last checkpoint."""
    start = time.monotonic()
    deadline, cap = start + timeout_s, start + STALL_CAP * timeout_s
    sampled, cpu = start, cpu_seconds({p.pid for p in self.procs.values()})
    while time.monotonic() < min(deadline, cap):
      if restart_crashed:
        for m in range(self.learners):
          codes = [self.procs[n].poll() for n in self.learner_names(m)]
          if _crashed(codes) and self.starts[f"learner{m}"] <= MAX_RESTARTS:
            self.kill(f"learner{m}")
            self.start_learner(m)
      if all(p.poll() is not None for p in self.procs.values()):
        break
      time.sleep(0.2)
      if cpu is not None and time.monotonic() - sampled >= SAMPLE_S:
        now_cpu = cpu_seconds({p.pid for p in self.procs.values()})
        if now_cpu is not None and now_cpu - cpu >= CPU_PROGRESS_S:
          deadline = time.monotonic() + timeout_s  # it is working: the stall starts again
        sampled, cpu = time.monotonic(), now_cpu
    return {n: p.poll() for n, p in self.procs.items()}

  def stop(self, grace_s: float = 5.0) -> None:
    """SIGTERM everything still running, then SIGKILL what did not exit within `grace_s`."""
    for proc in self.procs.values():
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for name, proc in self.procs.items():
      try:
        proc.wait(max(deadline - time.monotonic(), 0.01))
      except subprocess.TimeoutExpired:
        self.kill(name)


MAX_RESTARTS = 3  # restarts of one learner under `wait(restart_crashed=True)`
STALL_CAP = 4  # `wait`: a run's longest wait, in stalls
SAMPLE_S = 2.0  # `wait`: how often the processes' CPU time is read
CPU_PROGRESS_S = 0.5  # `wait`: the CPU seconds between two samples that count as working


def cpu_seconds(groups: set[int]) -> float | None:
  """The CPU seconds used so far by the running processes of these process groups (each process
  of a cluster leads its own), from /proc; None where there is no /proc."""
  try:
    entries = os.listdir("/proc")
  except OSError:
    return None
  total = 0
  for entry in entries:
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # (the name may hold spaces)
    except (OSError, IndexError):
      continue  # (gone since the listing)
    if int(fields[2]) in groups:  # pgrp; then utime, stime, cutime, cstime (fields 14-17)
      total += sum(int(x) for x in fields[11:15])
  return total / os.sysconf("SC_CLK_TCK")


def _crashed(codes: list[int | None]) -> bool:
  """Whether a learner's processes (their exit codes, None: running) are to be restarted: one of
  them crashed (a chaos crash, a signal that killed it, process 0 ending inside a run of steps),
  or one failed while the others still run (a multi-process job cannot go on without it)."""
  from diloco.rpc.learner_faults import CRASH_EXIT
  from diloco.rpc.multihost import FAILED_EXIT

  done = [c for c in codes if c is not None]
  if any(c in (CRASH_EXIT, FAILED_EXIT) or c < 0 for c in done):
    return True
  return any(c != 0 for c in done) and len(done) < len(codes)


def with_arg(spec: str, key: str, value) -> str:
  """`spec` (file[:a=1,b]) with key=value added to its argument."""
  return f"{spec}{',' if ':' in spec else ':'}{key}={value}"


def load_config(spec: str, overrides: tuple[str, ...] = ()):
  """The config a process started with --config=SPEC and these --config.KEY=VALUE overrides
  gets (checked here, so that a bad override fails before any process starts)."""
  from absl import flags
  from ml_collections import config_flags

  from diloco.config import deploy as deploy_lib

  bad = [o for o in overrides if not o.startswith("--config.")]
  if bad:
    raise ValueError(f"expected --config.KEY=VALUE overrides, got {bad}")
  path, _, arg = spec.partition(":")
  if not os.path.exists(path) and os.path.exists(os.path.join(REPO, path)):
    spec = os.path.join(REPO, path) + (":" + arg if arg else "")
  argv = ["local", f"--config={spec}", *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
  try:
    values(argv)
  except (flags.Error, AttributeError, KeyError) as err:
    raise ValueError(f"cannot load --config={spec} with {list(overrides)}: {err!r}") from err
  config = values.config
  deploy_lib.check(config.deploy)
  return config


def xla_flags(devices: int, inherited: str | None = None) -> str:
  """XLA_FLAGS for a process of `devices` CPU devices: this process's other flags (e.g. the
  tests' optimisation level, which must match for bit-identical runs) and the device count."""
  flags = (os.environ.get("XLA_FLAGS", "") if inherited is None else inherited).split()
  kept = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count=")]
  return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


def free_port() -> int:
  """A TCP port free on loopback now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
