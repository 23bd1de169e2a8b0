"""A checksum manifest beside each checkpoint: every file's size and sha256, written once the save
is complete; a step whose files do not match it (truncated, a flipped byte, missing) is not used.

The manifest is `<step dir>/diloco_manifest.json`, written under a temporary name and renamed once
orbax has committed the step (orbax writes into a temporary directory and commits by renaming it,
or with `commit_success.txt` on object stores). A committed step whose manifest was never written
(a kill between the two) is whole by orbax's commit: its owner writes the manifest when it next
opens the directory (`seal_committed`). A step that fails its manifest is skipped; the owner of a
checkpoint directory sets it aside (`<step>.corrupt-<n>`, kept for inspection) so that the run can
save that step again.
"""

import hashlib
import json
import os
import threading
from collections.abc import Iterable

from absl import logging

NAME = "diloco_manifest.json"
_CHUNK = 1 << 20


def _files(step_dir: str) -> list[str]:
  out = []
  for root, _, names in os.walk(step_dir):
    for n in names:
      rel = os.path.relpath(os.path.join(root, n), step_dir)
      if rel != NAME and not rel.startswith(NAME + "."):
        out.append(rel)
  return sorted(out)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def write(step_dir: str) -> dict[str, list]:
  """Writes the manifest of every file now in `step_dir`; returns it (rel path -> [size, sha256])."""
  entries = {}
  for rel in _files(step_dir):
    path = os.path.join(step_dir, rel)
    entries[rel] = [os.path.getsize(path), _sha256(path)]
  tmp = os.path.join(step_dir, f"{NAME}.tmp{os.getpid()}.{threading.get_ident()}")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"files": entries}, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(step_dir, NAME))
  return entries


def exists(step_dir: str) -> bool:
  return os.path.exists(os.path.join(step_dir, NAME))


def seal_committed(step_dir: str) -> bool:
  """Writes the manifest of a step orbax committed (its final directory: a save in progress is a
  `<step>.orbax-checkpoint-tmp-*` directory) but that has none, because the process ended between
  orbax's commit and the manifest; logs it. True when it wrote one."""
  if not os.path.isdir(step_dir) or exists(step_dir):
    return False
  manifest = write(step_dir)
  logging.warning(
      "checkpoint %s was committed by orbax but its checksum manifest was not written (the "
      "process ended between the two): taken whole as orbax committed it, %d files checksummed "
      "now",
      step_dir,
      len(manifest),
  )
  return True


def problem(step_dir: str) -> str | None:
  """Why `step_dir` must not be restored (no manifest, a file missing, truncated or changed), or
  None when every file matches its manifest."""
  path = os.path.join(step_dir, NAME)
  if not os.path.isdir(step_dir):
    return f"{step_dir} does not exist"
  try:
    with open(path, encoding="utf-8") as f:
      entries = json.load(f)["files"]
  except FileNotFoundError:
    return "no checksum manifest: the save did not finish"
  except (OSError, ValueError, KeyError) as e:
    return f"unreadable checksum manifest ({e})"
  for rel, (size, digest) in sorted(entries.items()):
    file = os.path.join(step_dir, rel)
    if not os.path.isfile(file):
      return f"{rel} is missing"
    got = os.path.getsize(file)
    if got != size:
      return f"{rel} is truncated or grown: {got} bytes, {size} when saved"
    if _sha256(file) != digest:
      return f"{rel} does not match its sha256 (a changed byte)"
  return None


def set_aside(directory: str, step: int) -> str:
  """Renames step `step`'s directory to the first free `<step>.corrupt-<n>` beside it; its path.

  Orbax's step listing takes only names that are a whole number (`<prefix>_<number>` with a step
  prefix), so the renamed directory is no step to it: never restored, never counted against
  `max_to_keep`, never deleted; the step can be saved again. Nothing is deleted.
  """
  n = 1
  while os.path.exists(os.path.join(directory, f"{step}.corrupt-{n}")):
    n += 1
  target = os.path.join(directory, f"{step}.corrupt-{n}")
  os.rename(os.path.join(directory, str(step)), target)
  return target


def intact_steps(
    directory: str, steps: Iterable[int], memo: dict | None = None, move: bool = False
) -> list[int]:
  """The steps (sub-directories of `directory`) whose files match their manifest, newest first;
  the others are logged with the reason, and with `move` set aside (`set_aside`) so that the run
  can save those steps again. `memo` (kept by the caller) remembers each verdict for as long as
  the step's manifest file is unchanged, so asking again does not re-read the files."""
  out = []
  for step in sorted(steps, reverse=True):
    step_dir = os.path.join(directory, str(step))
    try:
      st = os.stat(os.path.join(step_dir, NAME))
      key = (step, st.st_mtime_ns, st.st_size)
    except OSError:
      key = None
    why = memo[key] if memo is not None and key in memo else problem(step_dir)
    if memo is not None and key is not None:
      memo[key] = why
    if why is None:
      out.append(step)
      continue
    if move and os.path.isdir(step_dir):
      why += f"; moved to {set_aside(directory, step)} (kept for inspection)"
      if memo is not None:
        memo.pop(key, None)
    logging.warning("checkpoint %d (step %d) in %s is not used: %s", step, step, directory, why)
  return out
