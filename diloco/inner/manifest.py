"""A checksum manifest beside each checkpoint: every file's size and checksum, written once the
save is complete; a step whose files do not match it (truncated, a flipped byte, missing) is not
used.

The manifest is `<step dir>/diloco_manifest.json`, written whole (diloco/paths.py) once orbax has
committed the step (orbax writes into a temporary directory and commits by renaming it, or with
`commit_success.txt` on object stores). A committed step whose manifest was never written (a kill
between the two) is whole by orbax's commit: its owner writes the manifest when it next opens the
directory (`seal_committed`). A step that fails its manifest is skipped; the owner of a checkpoint
directory sets it aside (`<step>.corrupt-<n>`, kept for inspection) so that the run can save that
step again.

On a local disk the checksum is each file's sha256, read whole. In a bucket it is the CRC32C that
Cloud Storage computed when each object was written (an S3-style store's ETag), which one listing
gives for all of them, and a check lists the step again and compares: no byte of the checkpoint is
read back. A manifest names its kind, and a copy elsewhere is checked by it (a bucket's CRC32C
computed from a local copy's bytes, a local sha256 from a bucket's objects). An object rewritten or
cut short is a new upload with its own checksum and size, so it is caught the same way; a byte
flipped at rest inside the store is the store's to catch (Cloud Storage checks the same CRC32C on
every read).
"""

import base64
import hashlib
import json
from collections.abc import Iterable

from absl import logging

from diloco import paths

NAME = "diloco_manifest.json"
COMMIT_MARKER = "commit_success.txt"  # orbax's commit of a step on an object store
_CHUNK = 1 << 20


def _files(step_dir: str) -> dict[str, dict]:
  """Rel path -> the storage's details of every file of the step but the manifest."""
  listed = paths.files(step_dir)
  return {r: i for r, i in sorted(listed.items()) if r != NAME and not r.startswith(NAME + ".")}


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with paths.open_read(path) as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _crc32c(path: str) -> str:
  """Cloud Storage's form of a file's CRC32C: base64 of its 4 big-endian bytes."""
  import google_crc32c

  c = google_crc32c.Checksum()
  with paths.open_read(path) as f:
    while chunk := f.read(_CHUNK):
      c.update(chunk)
  return base64.b64encode(c.digest()).decode()


def _kind(listed: dict[str, dict], step_dir: str) -> str:
  """The checksum a manifest of this step holds: what the store lists for every object (no byte
  read), else sha256."""
  if paths.is_local(step_dir) or not listed:
    return "sha256"
  for kind in ("crc32c", "ETag"):
    if all(info.get(kind) for info in listed.values()):
      return kind
  return "sha256"


def _digest(kind: str, step_dir: str, rel: str, info: dict) -> str:
  """The file's checksum of `kind`: the listing's when the store keeps it, else from its bytes."""
  if info.get(kind):
    return info[kind]
  path = paths.join(step_dir, rel)
  if kind == "sha256":
    return _sha256(path)
  if kind == "crc32c":
    return _crc32c(path)
  raise ValueError(f"{path}: a {kind} checksum can only be read from the store that made it")


def _checksums(step_dir: str) -> tuple[str, dict[str, list]]:
  """(kind, rel path -> [size, digest]) of every file of the step."""
  listed = _files(step_dir)
  kind = _kind(listed, step_dir)
  return kind, {
      rel: [int(info["size"]), _digest(kind, step_dir, rel, info)] for rel, info in listed.items()
  }


def committed(step_dir: str) -> bool:
  """Orbax committed the step: on Cloud Storage, where orbax writes the final names from the
  start, its commit marker is there; elsewhere the step is its final directory (a save in
  progress is a `<step>.orbax-checkpoint-tmp-*` one)."""
  if paths.absolute(step_dir).startswith("gs://"):
    return paths.exists(paths.join(step_dir, COMMIT_MARKER))
  return paths.isdir(step_dir)


def write(step_dir: str) -> dict[str, list]:
  """Writes the manifest of every file now in `step_dir`; returns it (rel path -> [size, digest])."""
  digest, entries = _checksums(step_dir)
  record = {"files": entries} if digest == "sha256" else {"digest": digest, "files": entries}
  if any(d is None for _, d in entries.values()):
    raise OSError(f"{step_dir}: the store listed no {digest} for some of its files")
  paths.write_text(paths.join(step_dir, NAME), json.dumps(record, indent=1, sort_keys=True))
  return entries


def exists(step_dir: str) -> bool:
  return paths.exists(paths.join(step_dir, NAME))


def seal_committed(step_dir: str) -> bool:
  """Writes the manifest of a step orbax committed (`committed`) that has none, because the
  process ended between orbax's commit and the manifest; logs it. True when it wrote one."""
  if not committed(step_dir) or exists(step_dir):
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
  if not paths.isdir(step_dir):
    return f"{step_dir} does not exist"
  try:
    record = json.loads(paths.read_text(paths.join(step_dir, NAME)))
    entries, kind = record["files"], record.get("digest", "sha256")
  except FileNotFoundError:
    return "no checksum manifest: the save did not finish"
  except (OSError, ValueError, KeyError) as e:
    return f"unreadable checksum manifest ({e})"
  listed = _files(step_dir)
  for rel, (size, digest) in sorted(entries.items()):
    if rel not in listed:
      return f"{rel} is missing"
    got = int(listed[rel]["size"])
    if got != size:
      return f"{rel} is truncated or grown: {got} bytes, {size} when saved"
    try:
      changed = _digest(kind, step_dir, rel, listed[rel]) != digest
    except (ValueError, OSError) as e:
      return str(e)
    if changed:
      return f"{rel} does not match its {kind} (a changed byte)"
  return None


def set_aside(directory: str, step: int) -> str:
  """Renames step `step`'s directory to the first free `<step>.corrupt-<n>` beside it; its path.

  Orbax's step listing takes only names that are a whole number (`<prefix>_<number>` with a step
  prefix), so the renamed directory is no step to it: never restored, never counted against
  `max_to_keep`, never deleted; the step can be saved again. Nothing is deleted.
  """
  n = 1
  while paths.exists(paths.join(directory, f"{step}.corrupt-{n}")):
    n += 1
  target = paths.join(directory, f"{step}.corrupt-{n}")
  paths.rename(paths.join(directory, str(step)), target)
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
    step_dir = paths.join(directory, str(step))
    version = paths.version(paths.join(step_dir, NAME))
    key = None if version is None else (step, *version)
    why = memo[key] if memo is not None and key in memo else problem(step_dir)
    if memo is not None and key is not None:
      memo[key] = why
    if why is None:
      out.append(step)
      continue
    if move and paths.isdir(step_dir):
      why += f"; moved to {set_aside(directory, step)} (kept for inspection)"
      if memo is not None:
        memo.pop(key, None)
    logging.warning("checkpoint %d (step %d) in %s is not used: %s", step, step, directory, why)
  return out
