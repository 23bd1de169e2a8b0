"""Orbax checkpoints of the synchronizer's durable state (`Synchronizer.state_dict()`), written
incrementally: a save writes only the fragments merged since the fragments on disk.

Layout (format 2) under the checkpoint directory:

- `<merges>/`: one orbax step per save, named by the number of merges so far: `meta` (the JSON
  metadata plus the layout: each fragment's version, `LAYOUT`) and `arrays` (the arrays that
  belong to no fragment: the versions).
- `fragments/<p>.v<version>/`: one fragment's arrays (`global.p.i`, `residual.p.i`, `opt.p.i`)
  at that version, written once when a save first holds it and shared by every later save until
  the fragment merges again (a shard's, in a joint state, `shard<s>.<p>.v<version>`).

A save writes the fragments it lacks first, then its step, so a step is only committed once every
fragment it names is on disk. Orbax writes each into a temporary directory and renames it when
whole, so a crash in the middle of a save leaves the previous step the newest (orbax ignores the
unfinished directory, and replaces it if that step is saved again); its fragments, newer than any
step names, are removed when the directory is restored. After each save the fragments no kept step
names are deleted. `save(..., interrupt=True)` is that crash, injected on purpose: it writes the
fragments and part of the step, then raises `SimulatedCrash`.

Each complete step and fragment gets a checksum manifest (diloco/inner/manifest.py): restores use
the newest step whose files, and its fragments' files, match theirs, log why a newer one was
passed over and rename a corrupt step aside. A step of format 1 (every array in the step, before
this layout) restores as it was written.

`BackgroundSaves` runs the saves of a real-time synchronizer on a thread of its own, off the
host's lock, so merges and polls go on while orbax writes.
"""

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from diloco import paths
from diloco.inner import manifest

LAYOUT = "checkpoint_layout"  # the meta key of a step's layout (not part of the state)
FORMAT = 2
FRAGMENTS = "fragments"
_FRAGMENT_ARRAY = re.compile(r"^(?P<prefix>.*?)(global|residual|opt)\.(?P<p>\d+)\.\d+$")


class SimulatedCrash(RuntimeError):
  """The synchronizer died here (injected by a fault schedule or a test)."""


class _CrashingJsonHandler(ocp.handlers.JsonCheckpointHandler):
  """Writes half of its JSON file, then dies."""

  async def _save_fn(self, x, directory):
    text = str(x)
    (epath.Path(directory) / "partial").write_text(text[: len(text) // 2])
    raise SimulatedCrash("synchronizer crashed while writing a checkpoint")


@ocp.args.register_with_handler(_CrashingJsonHandler, for_save=True)
@dataclasses.dataclass
class _CrashingSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(_CrashingJsonHandler, for_restore=True)
@dataclasses.dataclass
class _CrashingRestore(ocp.args.CheckpointArgs):
  """Never used: orbax wants a restore argument type for every handler."""


def split(arrays: Mapping[str, np.ndarray]) -> tuple[dict, dict[str, dict], dict[str, int]]:
  """(the arrays of no fragment, fragment item name -> its arrays, item name -> its version).

  A fragment's arrays are `<prefix>global|residual|opt.<p>.<i>`; its version is entry k of
  `<prefix>versions`, p being the k-th fragment of that prefix in index order. Without a versions
  array every array is in the first dict (a state that is not a synchronizer's)."""
  rest, parts, owned = {}, {}, {}
  for name, x in arrays.items():
    m = _FRAGMENT_ARRAY.match(name)
    if m is None or f"{m['prefix']}versions" not in arrays:
      rest[name] = x
      continue
    item = f"{m['prefix'].replace('/', '.')}{int(m['p'])}"
    parts.setdefault(item, {})[name] = x
    owned.setdefault(m["prefix"], {})[int(m["p"])] = item
  versions = {}
  for prefix, items in owned.items():
    held = np.asarray(arrays[f"{prefix}versions"])
    if len(held) != len(items):
      raise ValueError(f"{prefix}versions has {len(held)} entries for fragments {sorted(items)}")
    for k, p in enumerate(sorted(items)):
      versions[items[p]] = int(held[k])
  return rest, parts, versions


def _nbytes(arrays: Mapping[str, np.ndarray]) -> int:
  return sum(np.asarray(x).nbytes for x in arrays.values())


class SyncCheckpointer:
  """Saves `state_dict()`s synchronously, each writing only the fragments not yet on disk, and
  restores the newest intact one (the module doc)."""

  def __init__(self, directory: str, keep: int = 2):
    self.directory, self.keep = paths.absolute(directory), keep
    self.fragments_dir = paths.join(self.directory, FRAGMENTS)
    self._verified: dict = {}  # manifest.intact_steps's verdicts
    self._layouts: dict[int, dict[str, int]] = {}  # step -> the fragments it names
    self._on_disk: dict[str, int] = {}  # fragment item -> the version this process wrote/read
    self.saves = 0
    self.bytes_written = 0  # array bytes of every save that committed (fragments and steps)
    self._open()

  def _open(self) -> None:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=self.keep, create=True, enable_async_checkpointing=False
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._writer = ocp.Checkpointer(ocp.StandardCheckpointHandler())

  def intact_steps(self) -> list[int]:
    """Steps whose files match their checksum manifest and whose layout reads, newest first (the
    others are logged and set aside as `<merges>.corrupt-<n>`, so that those merges can be saved
    again).

    A process killed while orbax removed its oldest step (`keep`) leaves that step's directory
    with some of its files: neither a save in progress nor a commit to orbax's eye, so it is
    sealed as committed above, but its items are gone and reading its layout raised (a restarted
    synchronizer then failed in every restore)."""
    steps = self._manager.all_steps()
    for step in steps:  # committed by orbax, killed before its manifest: whole, sealed now
      manifest.seal_committed(paths.join(self.directory, str(step)))
    intact = manifest.intact_steps(self.directory, steps, self._verified, move=True)
    for step in list(intact):
      try:
        self._layout(step)
      except (KeyError, FileNotFoundError) as e:  # orbax: an item not found in the step
        moved = manifest.set_aside(self.directory, step)
        logging.warning(
            "synchronizer checkpoint %d in %s is not used: its layout does not read (%s); moved to "
            "%s (kept for inspection)", step, self.directory, e, moved
        )  # fmt: skip
        intact.remove(step)
    if len(intact) < len(steps):
      self._manager.reload()  # orbax caches its step list: forget the steps set aside
    return intact

  def latest_step(self) -> int | None:
    steps = self.intact_steps()
    return steps[0] if steps else None

  def _fragment_path(self, item: str, version: int) -> str:
    return paths.join(self.fragments_dir, f"{item}.v{version}")

  def _write_fragments(self, parts: dict[str, dict], versions: dict[str, int]) -> int:
    """Writes each fragment item this directory lacks at its version; the bytes written."""
    written = 0
    for item, arrays in parts.items():
      if self._on_disk.get(item) == versions[item]:
        continue
      path = self._fragment_path(item, versions[item])
      self._writer.save(path, args=ocp.args.StandardSave(arrays), force=True)
      manifest.write(path)
      self._on_disk[item] = versions[item]
      written += _nbytes(arrays)
    return written

  def save(self, merges: int, state: dict[str, Any], interrupt: bool = False) -> bool:
    """Saves `state` as step `merges` (skipped if that step exists); see the module doc.

    A save that fails with an OSError (a full disk) is logged and returns False; the previous
    checkpoint stays the newest intact one.
    """
    if merges in self._manager.all_steps():
      return False
    rest, parts, versions = split(state["arrays"])
    layout = {"format": FORMAT, "fragments": sorted(versions.items())}
    try:
      written = self._write_fragments(parts, versions)
    except OSError as e:
      logging.error("synchronizer checkpoint %d in %s failed (%s)", merges, self.directory, e)
      return False
    items = {
        "arrays": ocp.args.StandardSave(rest),
        "meta": ocp.args.JsonSave({**state["meta"], LAYOUT: layout}),
    }
    if interrupt:
      items["crash"] = _CrashingSave({"merges": merges})
      absl_logger = logging.get_absl_logger()
      level = absl_logger.level
      absl_logger.setLevel("CRITICAL")  # orbax logs the injected exception as an error
      try:
        return self._manager.save(merges, args=ocp.args.Composite(**items), force=True)
      finally:
        absl_logger.setLevel(level)
    try:
      saved = self._manager.save(merges, args=ocp.args.Composite(**items), force=True)
    except OSError as e:
      logging.error("synchronizer checkpoint %d in %s failed (%s)", merges, self.directory, e)
      return False
    if saved:
      manifest.write(paths.join(self.directory, str(merges)))
      self._layouts[merges] = dict(versions)
      self.saves += 1
      self.bytes_written += written + _nbytes(rest)
      self._collect()
    return saved

  def _layout(self, step: int) -> dict[str, int] | None:
    """The fragments step `step` names (None: a step of format 1, every array in it)."""
    if step not in self._layouts:
      meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
      layout = meta["meta"].get(LAYOUT)
      if layout is not None and int(layout["format"]) > FORMAT:
        raise ValueError(
            f"synchronizer checkpoint {step} in {self.directory} has format "
            f"{layout['format']}; this code reads formats 1-{FORMAT} (a newer version wrote it)"
        )
      self._layouts[step] = None if layout is None else dict(layout["fragments"])
    return self._layouts[step]

  def _fragment_items(self) -> list[tuple[str, int, str]]:
    """(item, version, directory name) of every fragment directory on disk."""
    out = []
    for name in paths.listdir(self.fragments_dir) if paths.isdir(self.fragments_dir) else []:
      item, dot_v, version = name.rpartition(".v")
      if dot_v and version.isdigit():
        out.append((item, int(version), name))
      elif ".orbax-checkpoint-tmp" in name:
        out.append(("", -1, name))  # a write cut short: never named by a step
    return out

  def _collect(self, newest: dict[str, int] | None = None) -> None:
    """Deletes fragment directories no kept step names, and those newer than `newest` (the
    layout just restored: what a crashed save wrote after it, before its step committed)."""
    named = set()
    for step in self._manager.all_steps():
      named |= set((self._layout(step) or {}).items())
    for item, version, name in self._fragment_items():
      newer = newest is not None and version > newest.get(item, -1)
      if (item, version) not in named or newer:
        paths.rmtree(paths.join(self.fragments_dir, name))
        if self._on_disk.get(item) == version:
          del self._on_disk[item]

  def _fragment_problem(self, layout: Mapping[str, int]) -> str | None:
    for item, version in sorted(layout.items()):
      path = self._fragment_path(item, version)
      if (item, version) not in self._verified:
        self._verified[(item, version)] = (
            manifest.problem(path) if paths.isdir(path) else "its directory is missing"
        )
      if self._verified[(item, version)]:
        return f"fragment {item} v{version}: {self._verified[(item, version)]}"
    return None

  def restore(self, like: dict[str, Any], step: int | None = None) -> dict[str, Any]:
    """The newest intact (or `step`'s) state, with the array shapes of `like` (a `state_dict()`).

    A step one of whose fragments is missing or fails its manifest is passed over (logged)."""
    steps = [step] if step is not None else self.intact_steps()
    for s in steps:
      layout = self._layout(s)
      why = None if layout is None else self._fragment_problem(layout)
      if why is None:
        return self._restore(s, layout, like)
      logging.warning("synchronizer checkpoint %d in %s passed over: %s", s, self.directory, why)
    raise FileNotFoundError(f"no intact synchronizer checkpoint in {self.directory}")

  def _restore(self, step: int, layout: dict | None, like: dict[str, Any]) -> dict[str, Any]:
    rest, parts, _ = split(like["arrays"]) if layout is not None else (like["arrays"], {}, {})
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(arrays=ocp.args.StandardRestore(rest), meta=ocp.args.JsonRestore()),
    )
    arrays = dict(restored["arrays"])
    for item, version in (layout or {}).items():
      if item not in parts:
        raise ValueError(f"synchronizer checkpoint {step} holds fragment {item}, this run not")
      path = self._fragment_path(item, version)
      arrays.update(self._writer.restore(path, args=ocp.args.StandardRestore(parts[item])))
    meta = {k: v for k, v in restored["meta"].items() if k != LAYOUT}
    if layout is not None:
      self._on_disk = dict(layout)
      self._collect(newest=layout)
    return {"arrays": arrays, "meta": meta}

  def reopen(self) -> None:
    """Forgets the open manager, as a restarted process would, and reads the directory anew."""
    self._manager.close()
    self._layouts, self._on_disk, self._verified = {}, {}, {}
    self._open()

  def close(self) -> None:
    self._manager.close()


class BackgroundSaves:
  """A real-time synchronizer's saves, on a thread of their own and off its host's lock.

  `request()` (a Checkpoint action, under the lock) marks the state as worth saving. The thread
  takes `snapshot()` under `lock` (the state's arrays by reference: a merge replaces a fragment's
  arrays and never writes into them, outer/sync/commit.py) and writes it with `ckpt.save` after
  releasing the lock. Saves never overlap, and a save starts no sooner than the last one's
  duration / `share` after the last one started, so saving takes at most `share` of the time
  (of the disk's measured write bandwidth). What a save did not hold when the synchronizer dies,
  the learners send again when they re-join (`learner_machine.regressed`).
  """

  def __init__(
      self,
      ckpt: SyncCheckpointer,
      lock,
      snapshot: Callable[[], tuple[int, dict[str, Any]]],
      share: float,
      clock: Callable[[], float] = time.monotonic,
      on_saved: Callable[[dict[str, Any]], None] = lambda record: None,
  ):
    if not 0 < share <= 1:
      raise ValueError(f"share={share}: expected a share of the time in (0, 1]")
    self.ckpt, self.lock, self.snapshot, self.share, self.clock = ckpt, lock, snapshot, share, clock
    self.on_saved = on_saved  # a record of each save: merges, wall start, seconds, saved
    self._cv = threading.Condition()
    self._wanted = self._stop = False
    self._next_at = 0.0
    self.saves, self.seconds, self.in_flight_since = 0, 0.0, None
    self.waits = 0  # times the thread went to sleep (a test waits for it to, then looks)
    self._thread = threading.Thread(target=self._run, name="sync-saves", daemon=True)
    self._thread.start()

  def request(self) -> None:
    with self._cv:
      self._wanted = True
      self._cv.notify_all()

  def _due(self) -> bool:
    return self._wanted and self.clock() >= self._next_at

  def _run(self) -> None:
    while True:
      with self._cv:
        while not self._stop and not self._due():
          self.waits += 1
          self._cv.notify_all()
          self._cv.wait(None if not self._wanted else max(self._next_at - self.clock(), 0.0))
        if self._stop:
          return
        self._wanted = False
      with self.lock:
        merges, state = self.snapshot()
      t0, wall0 = self.clock(), time.time()
      with self._cv:
        self.in_flight_since = t0
      try:
        saved = self.ckpt.save(merges, state)
      except Exception:  # pylint: disable=broad-except
        logging.exception("synchronizer checkpoint %d failed", merges)
        saved = False
      took = self.clock() - t0
      self.on_saved(
          {"event": "save", "merges": merges, "start": wall0, "seconds": took, "saved": saved}
      )
      with self._cv:
        self.saves += saved
        self.seconds += took
        self._next_at = t0 + took / self.share
        self.in_flight_since = None
        self._cv.notify_all()

  def close(self) -> None:
    """Waits for the save in flight, then stops (what it did not save, the caller saves)."""
    with self._cv:
      self._stop = True
      self._cv.notify_all()
    self._thread.join()
