"""What runs inside Ray's workers: the synchronizer, a learner (one task per host of its slice),
and the directory actor through which they report their processes and the synchronizer's address.

Each task is the process itself (no child process), so the PID it reports is the one a crash or a
`kill` ends, and Ray then reports the task failed to the driver (diloco/launch/ray_launch.py).
"""

import os
import socket
import threading
import time


class Directory:
  """A Ray actor: the processes of the run (role -> pid, node, start time) and each synchronizer
  process's address once it listens (role sync, or sync<s> for shard s)."""

  def __init__(self):
    self.procs: dict[str, dict] = {}
    self.sync_addresses: dict[str, str] = {}

  def started(self, role: str, pid: int, host: str, node_id: str) -> None:
    self.procs[role] = {"pid": pid, "host": host, "node_id": node_id, "time": time.time()}

  def sync_at(self, address: str, role: str = "sync") -> None:
    self.sync_addresses[role] = address

  def state(self) -> dict:
    return {
        "procs": dict(self.procs),
        "sync_address": self.sync_addresses.get("sync"),
        "sync_addresses": dict(self.sync_addresses),
    }


def _announce(directory, role: str) -> str:
  """Tells the directory this process started; returns this node's IP address."""
  import ray  # pylint: disable=import-outside-toplevel

  node_id = ray.get_runtime_context().get_node_id()
  ray.get(directory.started.remote(role, os.getpid(), socket.gethostname(), node_id))
  return ray.util.get_node_ip_address()


def _report_port(workdir: str, ip: str, directory, role: str) -> None:
  """Waits for WORKDIR/port (removed before this start) and sends ip:port to the directory."""
  path = os.path.join(workdir, "port")
  while True:
    if os.path.exists(path):
      with open(path) as f:
        directory.sync_at.remote(f"{ip}:{int(f.read())}", role)
      return
    time.sleep(0.05)


def synchronizer(
    spec: str, overrides: tuple, workdir: str, token: str, directory, shard: int | None = None
) -> dict:
  """The synchronizer process (sync_main.run; shard `shard` of outer.sync_shards), bound to this
  node's address unless the config binds elsewhere; it restores its newest checkpoint when there
  is one."""
  from diloco.rpc import local, sync_main  # pylint: disable=import-outside-toplevel

  role = "sync" if shard is None else f"sync{shard}"
  ip = _announce(directory, role)
  config = local.load_config(spec, overrides)
  if config.deploy.bind == "127.0.0.1":
    config.deploy.bind = ip
  os.makedirs(workdir, exist_ok=True)
  if os.path.exists(os.path.join(workdir, "port")):
    os.remove(os.path.join(workdir, "port"))
  threading.Thread(target=_report_port, args=(workdir, ip, directory, role), daemon=True).start()
  return sync_main.run(config, workdir, token=token, shard=shard)


def learner(
    spec: str, overrides: tuple, workdir: str, m: int, target: str, token: str, directory
) -> dict:
  """One process of learner m (on TPU, one per host of its slice, --config.distributed=True)."""
  from diloco.rpc import learner_main, local  # pylint: disable=import-outside-toplevel

  role = f"learner{m}"
  if os.environ.get("TPU_WORKER_ID", "0") != "0":
    role += f".h{os.environ['TPU_WORKER_ID']}"
  _announce(directory, role)
  config = local.load_config(spec, overrides)
  return learner_main.run(config, workdir, learner_id=m, target=target, token=token)
