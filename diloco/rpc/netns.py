"""Hosts on one machine: a network namespace per host, veth pairs to a bridge, kernel-made faults.

`Network(["sync", "learner0", "learner1"])` makes a namespace for the bridge and one per host,
each host's `eth0` joined by a veth pair to the bridge (its end `h<i>` there), addresses
10.77.0.<i+2>/24 (only inside the namespaces it made). What the kernel then does to the run:

- `partition(host)`: the bridge's end of the host's link goes down. Its packets are dropped in
  both directions without a reset: an open TCP connection goes silent, a new one times out.
  `heal(host)` brings it back.
- `cap(host, bits_per_s)`: a token bucket (`tc tbf`) on both ends of the host's link, so its
  uploads and its downloads each pass at that rate (`downloads=False`: its uploads only);
  `uncap(host)` removes it. `unacked_bytes(host, peer)`: what the host sent the peer over TCP
  that is not acknowledged yet.
(Freezing a process, SIGSTOP and SIGCONT, needs no namespace: `LocalCluster.freeze`.)

Every namespace is named `dlnet-<pid>-<n>-<role>` (the creating process's id), deleted by
`close()`, at exit, and by the next `Network` of any process when its creator is gone, so an
interrupted run leaves nothing behind for long; `leftovers()` lists what remains (the suite
checks it at its end). Needs root and `ip netns` (`available()` says why not).
"""

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess

PREFIX = "dlnet-"
SUBNET = "10.77.0"
_COUNTER = itertools.count()
_OPEN: dict[str, "Network"] = {}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces() -> list[str]:
  """The names of this machine's network namespaces (`ip netns list`)."""
  try:
    out = _ip("netns", "list", check=False).stdout
  except FileNotFoundError:  # (no iproute2: no namespaces of ours either)
    return []
  return [line.split()[0] for line in out.splitlines() if line.strip()]


def available() -> str:
  """'' where namespaces can be made here, else why not (one line)."""
  if os.geteuid() != 0:
    return "network namespaces need root (ip netns add)"
  if not shutil.which("ip") or not shutil.which("tc"):
    return "iproute2 (ip, tc) is not installed"
  probe = f"{PREFIX}{os.getpid()}-probe"
  made = _ip("netns", "add", probe, check=False)
  if made.returncode != 0:
    return f"ip netns add failed: {made.stderr.strip() or made.returncode}"
  _ip("netns", "del", probe, check=False)
  return ""


def _creator(name: str) -> int | None:
  match = re.match(rf"{PREFIX}(\d+)-", name)
  return int(match.group(1)) if match else None


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _delete(ns: str) -> None:
  """Kills what still runs in `ns`, then deletes it (its links go with it)."""
  pids = _ip("netns", "pids", ns, check=False).stdout.split()
  for pid in pids:
    try:
      os.kill(int(pid), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
      pass
  _ip("netns", "del", ns, check=False)


def reap_orphans() -> list[str]:
  """Deletes the namespaces whose creating process is gone; returns their names."""
  gone = [ns for ns in namespaces() if ns.startswith(PREFIX) and not _pid_alive(_creator(ns) or 0)]
  for ns in gone:
    _delete(ns)
  return gone


def leftovers() -> list[str]:
  """Our namespaces still on this machine, and processes still inside any of them."""
  out = []
  for ns in namespaces():
    if ns.startswith(PREFIX):
      pids = _ip("netns", "pids", ns, check=False).stdout.split()
      out.append(ns + (f" (pids {' '.join(pids)})" if pids else ""))
  return out


def exec_prefix(namespace: str) -> list[str]:
  """The command prefix that runs a program in network namespace `namespace`."""
  return ["ip", "netns", "exec", namespace]


class Network:
  """A bridge and one namespace per host; see the module docstring."""

  def __init__(self, hosts: list[str]):
    if len(set(hosts)) != len(hosts) or not hosts:
      raise ValueError(f"hosts must be distinct names, got {hosts}")
    if len(hosts) > 200:
      raise ValueError("at most 200 hosts on one bridge")
    reap_orphans()
    n = next(_COUNTER)
    self.hosts = list(hosts)
    self.bridge = f"{PREFIX}{os.getpid()}-{n}-br"
    self.ns = {h: f"{PREFIX}{os.getpid()}-{n}-h{i}" for i, h in enumerate(hosts)}
    self._caps: set[str] = set()
    _OPEN[self.bridge] = self
    try:
      self._build()
    except BaseException:
      self.close()
      raise

  def _build(self) -> None:
    _ip("netns", "add", self.bridge)
    _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
    _ip("-n", self.bridge, "link", "set", "br0", "up")
    for i, host in enumerate(self.hosts):
      ns = self.ns[host]
      _ip("netns", "add", ns)
      _ip("-n", ns, "link", "set", "lo", "up")
      _ip("link", "add", f"h{i}", "netns", self.bridge, "type", "veth", "peer", "name", "eth0",
          "netns", ns)  # fmt: skip
      _ip("-n", self.bridge, "link", "set", f"h{i}", "master", "br0", "up")
      _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
      _ip("-n", ns, "link", "set", "eth0", "up")

  def address(self, host: str) -> str:
    return f"{SUBNET}.{self.hosts.index(host) + 2}"

  def prefix(self, host: str) -> list[str]:
    """The command prefix that runs a program on `host` (in its namespace)."""
    return exec_prefix(self.ns[host])

  def run(self, host: str, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*self.prefix(host), *args], capture_output=True, text=True, **kwargs)

  def unacked_bytes(self, host: str, peer: str) -> int:
    """Bytes `host` has sent to `peer` over TCP that `peer` has not acknowledged yet (the
    Send-Q of its established connections, `ss`): what is still on, or waiting for, the wire."""
    args = ["ss", "-tnH", "state", "established", "dst", self.address(peer)]
    out = self.run(host, args, check=True, timeout=10).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip())

  def _port(self, host: str) -> str:
    return f"h{self.hosts.index(host)}"

  def partition(self, *hosts: str) -> None:
    """Cuts each host off the bridge: its packets dropped both ways, no reset sent."""
    for host in hosts:
      _ip("-n", self.bridge, "link", "set", self._port(host), "down")

  def heal(self, *hosts: str) -> None:
    for host in hosts:
      _ip("-n", self.bridge, "link", "set", self._port(host), "up")

  def cap(self, host: str, bits_per_s: float, queue_s: float = 0.5, downloads: bool = True) -> None:
    """`host`'s uploads (and, with `downloads`, its downloads) at most `bits_per_s`: a token
    bucket (tbf) with a burst of one full-size packet at least, or 10 ms at the rate; packets
    that would wait past `queue_s` in its queue are dropped, as a router's buffer would."""
    rate = str(max(int(bits_per_s), 8000))
    burst = str(max(int(bits_per_s / 8 / 100), 1600))
    tbf = [
        "root",
        "tbf",
        "rate",
        f"{rate}bit",
        "burst",
        burst,
        "latency",
        f"{int(queue_s * 1000)}ms",
    ]
    ends = [(self.ns[host], "eth0")] + [(self.bridge, self._port(host))] * downloads
    for ns, dev in ends:
      subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, *tbf], check=True)
    self._caps.add(host)

  def uncap(self, host: str) -> None:
    for ns, dev in ((self.ns[host], "eth0"), (self.bridge, self._port(host))):
      subprocess.run(  # (one end may have none: `downloads=False`)
          ["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False, capture_output=True
      )
    self._caps.discard(host)

  def close(self) -> None:
    """Deletes every namespace of this network (their links and anything left inside)."""
    for ns in [*self.ns.values(), self.bridge]:
      if ns in namespaces():
        _delete(ns)
    _OPEN.pop(self.bridge, None)

  def __enter__(self) -> "Network":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


@atexit.register
def _close_open() -> None:
  for net in list(_OPEN.values()):
    net.close()
