"""Start, kill and restart a synchronizer and M learner processes on this machine.

Used by scripts/launch_local.py, scripts/chaos_local.py and the tests. Every process writes its log
to WORKDIR/logs/<name>.log (appended across restarts); the synchronizer binds 127.0.0.1 on a port
it picks itself and writes to WORKDIR/sync/port, which the learners are then pointed at.
"""

import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class LocalCluster:
    """Processes of one local run; `config` is the --config argument (file[:args])."""

    config: str
    learners: int
    workdir: str
    overrides: tuple[str, ...] = ()  # extra --config.key=value flags for every process
    devices_per_learner: int = 1
    token: str = dataclasses.field(default_factory=lambda: secrets.token_hex(16))
    absent_after_s: float = 3.0
    procs: dict = dataclasses.field(default_factory=dict)
    port: int | None = None
    starts: dict = dataclasses.field(default_factory=dict)

    def _env(self, devices: int) -> dict:
        env = dict(os.environ, DILOCO_TOKEN=self.token, JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        return env

    def _spawn(self, name: str, args: list[str], devices: int) -> subprocess.Popen:
        os.makedirs(os.path.join(self.workdir, "logs"), exist_ok=True)
        log = open(os.path.join(self.workdir, "logs", f"{name}.log"), "ab")
        proc = subprocess.Popen([sys.executable, *args, *self.overrides], cwd=REPO,
                                env=self._env(devices), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        self.starts[name] = self.starts.get(name, 0) + 1
        return proc

    def start_sync(self, timeout_s: float = 120.0) -> int:
        """Starts (or restarts) the synchronizer and waits for its port."""
        sync_dir = os.path.join(self.workdir, "sync")
        port_file = os.path.join(sync_dir, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        port = self.port or 0  # a restart reuses the port the learners know
        proc = self._spawn("sync", ["-m", "experiments.synchronizer", f"--config={self.config}",
                                    f"--workdir={sync_dir}", f"--port={port}",
                                    f"--absent_after_s={self.absent_after_s}"], 1)
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(port_file):
            if proc.poll() is not None:
                raise RuntimeError(f"synchronizer exited with {proc.returncode}; see "
                                   f"{self.workdir}/logs/sync.log")
            if time.monotonic() > deadline:
                raise TimeoutError("synchronizer did not write its port in time")
            time.sleep(0.1)
        with open(port_file) as f:
            self.port = int(f.read())
        return self.port

    def start_learner(self, m: int) -> subprocess.Popen:
        if self.port is None:
            raise ValueError("start the synchronizer first")
        return self._spawn(f"learner{m}", [
            "-m", "experiments.learner", f"--config={self.config}", f"--learner_id={m}",
            f"--synchronizer=127.0.0.1:{self.port}",
            f"--workdir={os.path.join(self.workdir, f'learner{m}')}"], self.devices_per_learner)

    def start(self) -> None:
        self.start_sync()
        for m in range(self.learners):
            self.start_learner(m)

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash would; no cleanup runs in the process."""
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def wait(self, timeout_s: float) -> dict[str, int | None]:
        """Waits for every process to exit by itself; returns their exit codes (None: running)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.2)
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
