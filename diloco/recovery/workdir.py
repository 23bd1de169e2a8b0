"""Keeps finished runs safe: a workdir that holds another run is refused, or moved aside whole.

`claim(workdir, config)` decides before anything is written: an empty or missing workdir (or one
with neither config.json nor run outputs) is "new"; one whose config.json equals this run's config
is "resume"; one that holds a run with another config, or run outputs without a config.json, is
refused with a `WorkdirError` listing the differing keys. `restart=True` instead renames a workdir
that holds any run (same config or not) to the first free sibling `<workdir>.old-<N>`
("restarted"; nothing is ever deleted), so that the caller starts in an empty one.
`write_config` then writes config.json atomically. A run holds its workdir while it runs (`Hold`):
a second run on the same workdir is refused naming the first (host, PID), and the hold of a run
that died is taken over with a note.

Configs compare as JSON writes them: nested dicts are flattened to dotted keys, and two values are
equal when their JSON texts are, so a tuple equals a list of the same items, while 1 and 1.0 (or 1
and true) differ.
"""

import atexit
import fcntl
import json
import os
import socket
import threading
import time
from typing import Any

from absl import logging

from diloco import errors, paths

CONFIG = "config.json"
RUN_OUTPUTS = ("summary.json", "metrics.jsonl", "checkpoints")  # any one means a run was here
MAX_LINES = 20  # differing keys listed in a refusal; the rest are counted
HOLDER_WAITS = 40  # 50 ms reads of a hold file still empty before a refusal says so (2 s)
_ABSENT = "(absent)"
_MAX_VALUE_CHARS = 80


class WorkdirError(errors.InputError):
  """The workdir holds another run; the message says how to start over or where else to go."""


def _flatten(tree: Any, prefix: str = "") -> dict[str, str]:
  """Dotted key -> the value's JSON text; an empty dict is a value of its own."""
  if isinstance(tree, dict) and tree:
    out = {}
    for k, v in tree.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: json.dumps(tree, sort_keys=True)}


def _differences(old: dict, new: dict) -> list[str]:
  """`key: old -> new` for each dotted key whose JSON differs (`(absent)` on a missing side)."""
  a, b = _flatten(json.loads(json.dumps(old))), _flatten(json.loads(json.dumps(new)))
  show = lambda v: v if len(v) <= _MAX_VALUE_CHARS else v[: _MAX_VALUE_CHARS - 3] + "..."
  return [
      f"{k}: {show(a.get(k, _ABSENT))} -> {show(b.get(k, _ABSENT))}"
      for k in sorted(a.keys() | b.keys())
      if a.get(k) != b.get(k)
  ]


def _aside_path(workdir: str) -> str:
  """The first free `<workdir>.old-<N>`, N from 1."""
  n = 1
  while paths.exists(f"{workdir}.old-{n}"):
    n += 1
  return f"{workdir}.old-{n}"


def _refusal(workdir: str, why: str, lines: list[str]) -> WorkdirError:
  shown = [f"  {line}" for line in lines[:MAX_LINES]]
  if len(lines) > MAX_LINES:
    shown.append(f"  and {len(lines) - MAX_LINES} more")
  return WorkdirError(
      "\n".join(
          [
              f"workdir {workdir} {why}" + (":" if shown else "."),
              *shown,
              f"To start over, pass --restart: it moves the old run to {_aside_path(workdir)}"
              " (nothing is deleted). Or pick another --workdir.",
          ]
      )
  )


def _read_config(path: str) -> dict | None:
  """The JSON object in `path` (a saved config, a hold), or None when it cannot be read as one."""
  try:
    saved = json.loads(paths.read_text(path))
  except (OSError, ValueError):
    return None
  return saved if isinstance(saved, dict) else None


def _held_run(
    workdir: str, config: dict, ignore: tuple[str, ...] = ()
) -> tuple[str, list[str]] | None:
  """None when `workdir` holds no run; else why this run may not resume it ("" when it may) and
  the differing keys."""
  if paths.isfile(workdir):
    raise WorkdirError(f"workdir {workdir} exists and is not a directory; pick another --workdir")
  names = set(paths.listdir(workdir))
  outputs = sorted(names.intersection(RUN_OUTPUTS))
  if CONFIG in names:
    saved = _read_config(paths.join(workdir, CONFIG))
    if saved is None:
      return f"holds a run whose {CONFIG} is not a readable JSON object", []
    lines = [d for d in _differences(saved, config) if d.split(":", 1)[0] not in ignore]
    why = f"holds a run whose {CONFIG} differs from this run's config (workdir's -> this run's)"
    return (why if lines else ""), lines
  if outputs:
    return f"holds a run without {CONFIG} ({', '.join(outputs)} found)", []
  return None


def claim(workdir: str, config: dict, restart: bool = False, ignore: tuple[str, ...] = ()) -> str:
  """Returns "new", "resume" or "restarted" (see the module doc); WorkdirError when refused.

  Writes nothing, except the rename of the whole workdir when `restart` moves an old run aside.
  `ignore`: dotted keys that may differ on a resume (how a run is watched, where it stops).
  """
  workdir = paths.absolute(workdir)
  paths.require_bucket(workdir, f"workdir {workdir}")
  held = _held_run(workdir, config, ignore)
  if held is None:
    return "new"
  why, lines = held
  if not restart:
    if not why:
      return "resume"
    raise _refusal(workdir, why, lines)
  paths.rename(workdir, _aside_path(workdir))
  return "restarted"


def write_config(workdir: str, config_json: str) -> None:
  """Writes `config_json` to `<workdir>/config.json` whole or not at all."""
  paths.write_text(paths.join(workdir, CONFIG), config_json)


def unclaim(workdir: str) -> bool:
  """Removes `<workdir>/config.json` when the workdir holds nothing else (but the hold file): a
  new run that stopped before writing anything of its own (a warm start that does not fit)
  leaves the workdir free for the corrected command. True when it did."""
  workdir = paths.absolute(workdir)
  if not paths.isdir(workdir) or set(paths.listdir(workdir)) - {CONFIG, HOLD}:
    return False
  paths.remove(paths.join(workdir, CONFIG))
  return True


def remove_if_empty(workdir: str) -> None:
  """Removes a local workdir that holds nothing (a bucket has no empty directories)."""
  if paths.is_local(workdir) and paths.isdir(workdir) and not paths.listdir(workdir):
    os.rmdir(paths.absolute(workdir))


HOLD = ".diloco-hold"  # the hold file: {"host", "pid", "since"} of the run that holds the workdir


def Hold(workdir: str) -> "LocalHold | BucketHold":  # pylint: disable=invalid-name
  """The hold of `workdir`: a lock on a local disk, a lease in a bucket."""
  workdir = paths.absolute(workdir)
  paths.require_bucket(workdir, f"workdir {workdir}")
  return BucketHold(workdir) if paths.is_url(workdir) else LocalHold(workdir)


class LocalHold:
  """One run's exclusive hold on its workdir: an fcntl lock on WORKDIR/.diloco-hold, which says
  who holds it. A second run is refused naming the holder; the lock of a process that died (even
  by SIGKILL) is released by the kernel, so its hold is stale and the next run takes it over,
  with a note."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self._fd: int | None = None

  @property
  def path(self) -> str:
    return os.path.join(self.workdir, HOLD)

  def acquire(self) -> "LocalHold":
    """Takes the hold (creating the workdir); WorkdirError naming the holder when it is held."""
    os.makedirs(self.workdir, exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read_holder(fd)
        for _ in range(HOLDER_WAITS):  # the holder took the lock and is writing who it is
          if holder:
            break
          time.sleep(0.05)
          holder = _read_holder(fd)
        os.close(fd)
        raise WorkdirError(
            f"workdir {self.workdir} is in use by another run: {_describe(holder)}. Wait for it "
            "to end or stop it, or pick another --workdir."
        ) from None
      if _same_file(fd, self.path):  # not a file a holder removed while we waited for it
        break
      os.close(fd)
    previous = _read_holder(fd)
    if previous and previous.get("pid") != os.getpid():
      logging.warning(
          "workdir %s was held by %s, which is gone (its lock was released): taking it over",
          self.workdir,
          _describe(previous),
      )
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    self._fd = fd
    atexit.register(self.release)  # a process that ends without releasing still tidies up
    return self

  def release(self) -> None:
    """Removes the hold file and lets go of the lock."""
    if self._fd is None:
      return
    try:  # where the file is now: a restart moves the workdir aside with it (Linux's /proc)
      where = os.readlink(f"/proc/self/fd/{self._fd}")
    except OSError:
      where = self.path
    try:
      if _same_file(self._fd, where):
        os.remove(where)
    except OSError:
      pass
    os.close(self._fd)  # closing the descriptor releases the lock
    self._fd = None

  def __enter__(self) -> "LocalHold":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


LEASE_S = 90.0  # a bucket hold not renewed for this long is its dead holder's


class BucketHold:
  """One run's hold on a bucket workdir: a lease object WORKDIR/.diloco-hold that says who holds
  it and when it last renewed (every LEASE_S / 6 s, on a thread). Object stores have no locks: a
  hold renewed within LEASE_S refuses a second run naming the holder; an older one is a dead
  holder's (even a SIGKILLed one stops renewing) and is taken over, with a note."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self._me: dict | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  @property
  def path(self) -> str:
    return paths.join(self.workdir, HOLD)

  def acquire(self) -> "BucketHold":
    previous = _read_config(self.path)
    if previous and (previous.get("host"), previous.get("pid")) != _whoami():
      age = time.time() - float(previous.get("beat", 0))
      if age < LEASE_S:
        raise WorkdirError(
            f"workdir {self.workdir} is in use by another run: {_describe(previous)}, its hold "
            f"renewed {age:.0f} s ago. Wait for it to end or stop it (a hold not renewed for "
            f"{LEASE_S:.0f} s is taken over), or pick another --workdir."
        )
      logging.warning(
          "workdir %s was held by %s, whose hold was last renewed %.0f s ago: taking it over",
          self.workdir,
          _describe(previous),
          age,
      )
    now = time.time()
    self._me = {"host": socket.gethostname(), "pid": os.getpid(), "since": now, "beat": now}
    paths.write_text(self.path, json.dumps(self._me))
    self._stop.clear()
    self._thread = threading.Thread(target=self._renew, name="workdir-hold", daemon=True)
    self._thread.start()
    atexit.register(self.release)
    return self

  def _renew(self) -> None:
    while not self._stop.wait(LEASE_S / 6):
      try:
        paths.write_text(self.path, json.dumps({**self._me, "beat": time.time()}))
      except Exception as e:  # pylint: disable=broad-except  (gcsfs's HttpError is no OSError)
        logging.warning("could not renew the hold of %s (%s); trying again", self.workdir, e)

  def release(self) -> None:
    """Stops renewing and removes the hold object if it is still this run's."""
    if self._me is None:
      return
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    held = _read_config(self.path)
    if held and (held.get("host"), held.get("pid")) == _whoami():
      paths.remove(self.path)
    self._me = None

  def __enter__(self) -> "BucketHold":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _whoami() -> tuple[str, int]:
  return socket.gethostname(), os.getpid()


def _read_holder(fd: int) -> dict | None:
  try:
    holder = json.loads(os.pread(fd, 4096, 0) or b"null")
  except (OSError, ValueError):
    return None
  return holder if isinstance(holder, dict) else None


def _describe(holder: dict | None) -> str:
  if not holder:
    return "a run whose hold file says nothing (being written)"
  since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
  return f"PID {holder.get('pid')} on host {holder.get('host')} (since {since})"


def _same_file(fd: int, path: str) -> bool:
  try:
    return os.fstat(fd).st_ino == os.stat(path).st_ino
  except OSError:
    return False
