"""The one path layer: every file the project reads or writes, on a local disk or in a bucket.

A path is a local path or a URL that fsspec serves (`gs://bucket/run`, `s3://...`); a URL stays a
URL (orbax and tensorstore write checkpoints to it natively). Each write appears whole or not at
all: a local file by writing a temporary name and renaming it, a bucket object by the object
store's own single upload. A bucket has no directories: `makedirs` does nothing there, and a
"directory" is the prefix of the objects under it.

Tests point gcsfs and tensorstore at a Cloud Storage server on the loopback (`python -m
experiments.gcs_emulator`: the environment it prints). The storage libraries' notes that are not
the user's business (a cache's settings, gcsfs's retries of an error that reaches us as its
exception) are left out of the log.
"""

from __future__ import annotations

import contextlib
import glob as glob_lib
import io
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO

import fsspec

from diloco import errors

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
for _name, _level in (("fsspec.caching", logging.WARNING), ("gcsfs", logging.WARNING)):
  logging.getLogger(_name).setLevel(_level)
logging.getLogger("gcsfs.retry").setLevel(logging.CRITICAL)  # the error is raised to us


def missing_bucket(path: str) -> str:
  """'' when `path` is local or its bucket is there; else the bucket's URL (one that does not
  exist, or that these credentials may not see)."""
  if not is_url(path):
    return ""
  fs, p = _fs(path)
  bucket = p.split("/", 1)[0]
  try:
    found = fs.exists(bucket)
  except OSError:  # (gcsfs: no access)
    found = False
  return "" if found else fs.unstrip_protocol(bucket)


# Cloud Storage's bucket names: 3-63 characters (up to 222 in dot-separated parts of at most 63),
# lowercase letters, digits, '-', '_' and '.', beginning and ending with a letter or digit.
_GCS_BUCKET = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{1,220})[a-z0-9]$")


def bad_bucket_name(path: str) -> str:
  """Why a gs:// URL's bucket cannot be a Cloud Storage bucket ('' when it can, or not gs://): an
  emulator takes any name that the storage library of a checkpoint refuses later, mid-run."""
  if not os.fspath(path).startswith("gs://"):
    return ""
  bucket = os.fspath(path)[len("gs://") :].split("/", 1)[0]
  parts = bucket.split(".")
  if not _GCS_BUCKET.match(bucket) or max(len(p) for p in parts) > 63 or "" in parts:
    return (
        f"gs://{bucket} is not a Cloud Storage bucket name (3-63 lowercase letters, digits, "
        f"'-', '_' or '.', first and last a letter or digit)"
    )
  return ""


def require_bucket(path: str, what: str) -> None:
  """InputError naming `what` when `path` is in a bucket that cannot exist by its name, and
  MissingInput when it is in one that does not exist (or that these credentials may not see);
  checked before anything is written there."""
  bad = bad_bucket_name(path)
  if bad:
    raise errors.InputError(f"{what}: {bad}")
  bucket = missing_bucket(path)
  if bucket:
    raise errors.MissingInput(f"{what}: the bucket {bucket} does not exist")


def is_url(path: str) -> bool:
  """A bucket (or any other fsspec) URL rather than a local path; `file://` is local."""
  path = os.fspath(path)
  return bool(_URL.match(path)) and not path.startswith("file://")


def is_local(path: str) -> bool:
  return not is_url(path)


def local_only(path: str, what: str) -> str:
  """`path` made absolute; ValueError for a URL, naming `what` (a tool whose files do not go
  through this layer yet)."""
  if is_url(path):
    raise ValueError(
        f"--workdir={path}: {what} writes with local file calls, so a bucket URL would become a "
        f"local directory; give a local path or a shared mount (bucket workdirs: "
        f"experiments.train, experiments.learner, experiments.synchronizer, "
        f"scripts/launch_local.py)"
    )
  return absolute(path)


def absolute(path: str) -> str:
  """A local path made absolute; a URL as given, less a trailing slash."""
  path = os.fspath(path)
  if is_url(path):
    return path.rstrip("/")
  return os.path.abspath(path.removeprefix("file://"))


def join(directory: str, *names: str) -> str:
  if is_local(directory):
    return os.path.join(_plain(directory), *names)
  return "/".join([directory.rstrip("/"), *names])


def dirname(path: str) -> str:
  path = os.fspath(path)
  return os.path.dirname(path) if is_local(path) else path.rstrip("/").rsplit("/", 1)[0]


def basename(path: str) -> str:
  path = os.fspath(path)
  return os.path.basename(path.rstrip("/")) if is_local(path) else path.rstrip("/").rsplit("/")[-1]


def _fs(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
  # No listing cache: other processes (tensorstore, the job's other hosts) write the bucket too.
  return fsspec.core.url_to_fs(path, use_listings_cache=False)


def _plain(path) -> str:
  """A path as a string; `file://` dropped (the local branches take plain paths)."""
  return os.fspath(path).removeprefix("file://")


def _url(fs: fsspec.AbstractFileSystem, stripped: str) -> str:
  """A listed object's name back as a URL."""
  return fs.unstrip_protocol(stripped)


def exists(path: str) -> bool:
  if is_local(path):
    return os.path.exists(_plain(path))
  fs, p = _fs(path)
  return fs.exists(p)


def isdir(path: str) -> bool:
  """A local directory, or a bucket prefix that has objects under it."""
  if is_local(path):
    return os.path.isdir(_plain(path))
  fs, p = _fs(path)
  return fs.isdir(p)


def isfile(path: str) -> bool:
  if is_local(path):
    return os.path.isfile(_plain(path))
  fs, p = _fs(path)
  return fs.isfile(p)


def makedirs(path: str) -> None:
  if is_local(path):
    os.makedirs(_plain(path), exist_ok=True)


def listdir(path: str) -> list[str]:
  """Names directly under `path` (files and directories); [] when there is nothing."""
  if is_local(path):
    path = _plain(path)
    return os.listdir(path) if os.path.isdir(path) else []
  fs, p = _fs(path)
  try:
    return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)})
  except FileNotFoundError:
    return []


def glob(pattern: str) -> list[str]:
  """Paths matching `pattern` (`**` crosses directories), sorted."""
  if is_local(pattern):
    return sorted(glob_lib.glob(_plain(pattern), recursive=True))
  fs, p = _fs(pattern)
  return sorted(_url(fs, m) for m in fs.glob(p))


def files(directory: str) -> dict[str, dict]:
  """Relative path -> the storage's details (`size`; a bucket's `crc32c`, `md5Hash`) of every file
  under `directory`, from one listing."""
  if is_local(directory):
    out, directory = {}, _plain(directory)
    for root, _, names in os.walk(directory):
      for n in names:
        full = os.path.join(root, n)
        out[os.path.relpath(full, directory)] = {"size": os.path.getsize(full)}
    return out
  fs, p = _fs(directory)
  found = fs.find(p, detail=True)
  root = p.rstrip("/") + "/"
  return {name[len(root) :]: info for name, info in found.items() if name.startswith(root)}


def sizes(directory: str) -> dict[str, int]:
  """Name -> bytes of every file directly in `directory`, from one listing."""
  fs, p = _fs(directory)
  listed = fs.ls(p, detail=True)
  return {
      e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e["size"])
      for e in listed
      if e["type"] == "file"
  }


def size(path: str) -> int:
  if is_local(path):
    return os.path.getsize(_plain(path))
  fs, p = _fs(path)
  return int(fs.size(p))


def version(path: str) -> tuple | None:
  """What changes when the file is written again (local: mtime and size; a bucket: the object's
  generation and size), or None when it is not there."""
  if is_local(path):
    try:
      st = os.stat(_plain(path))
    except OSError:
      return None
    return st.st_mtime_ns, st.st_size
  fs, p = _fs(path)
  try:
    info = fs.info(p)
  except FileNotFoundError:
    return None
  return info.get("generation") or info.get("ETag") or info.get("mtime"), int(info["size"])


def tree_bytes(directory: str) -> int:
  return sum(int(info["size"]) for info in files(directory).values())


def open_read(path: str) -> IO[bytes]:
  """`path` opened for reading bytes, in blocks."""
  if is_local(path):
    return open(_plain(path), "rb")
  fs, p = _fs(path)
  return fs.open(p, "rb")


def read_bytes(path: str) -> bytes:
  if is_local(path):
    with open(_plain(path), "rb") as f:
      return f.read()
  fs, p = _fs(path)
  return fs.cat_file(p)


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def write_bytes(path: str, data: bytes) -> None:
  """Writes `path` whole or not at all (a local temporary file renamed; one bucket upload)."""
  if is_url(path):
    fs, p = _fs(path)
    fs.pipe_file(p, data)
    return
  path = _plain(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  # (named after its target: a reader of the directory, such as a checksum manifest listing a
  # checkpoint's files, can tell it from the files it lists)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def writing(path: str, mode: str = "w") -> Iterator[IO]:
  """A file object whose contents replace `path` whole when the block ends without an error
  (for writers that take a file: pickle, numpy, matplotlib)."""
  buffer = io.BytesIO() if "b" in mode else io.StringIO()
  yield buffer
  data = buffer.getvalue()
  write_bytes(path, data if isinstance(data, bytes) else data.encode("utf-8"))


def remove(path: str) -> None:
  """Removes a file; nothing when it is not there."""
  if is_local(path):
    with contextlib.suppress(FileNotFoundError):
      os.remove(_plain(path))
    return
  fs, p = _fs(path)
  with contextlib.suppress(FileNotFoundError):
    fs.rm_file(p)


def rmtree(path: str) -> None:
  """Removes a directory and everything under it; nothing when it is not there."""
  if is_local(path):
    shutil.rmtree(_plain(path), ignore_errors=True)
    return
  fs, p = _fs(path)
  with contextlib.suppress(FileNotFoundError):
    fs.rm(p, recursive=True)


def rename(src: str, dst: str) -> None:
  """Moves a file or directory. In a bucket it is a copy of every object, then their removal
  (object stores have no rename); `dst` must not exist."""
  if is_local(src):
    os.rename(_plain(src), _plain(dst))
    return
  fs, p = _fs(src)
  _, q = _fs(dst)
  if fs.isfile(p):
    fs.copy(p, q)
    fs.rm_file(p)
    return
  for rel, _ in files(src).items():
    fs.copy(f"{p.rstrip('/')}/{rel}", f"{q.rstrip('/')}/{rel}")
  fs.rm(p, recursive=True)


def put_file(local_src: str, path: str) -> None:
  """Moves the local file `local_src` to `path`."""
  if is_local(path):
    path = _plain(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    os.replace(local_src, path)
    return
  fs, p = _fs(path)
  fs.put_file(local_src, p)
  os.remove(local_src)


def get_file(path: str, local_dst: str) -> None:
  """Copies `path` to the local file `local_dst`, in blocks (a shard need not fit in memory)."""
  fs, p = _fs(path)
  fs.get_file(p, local_dst)


def free_bytes(directory: str) -> float:
  """Free space where `directory` is; a bucket's is unbounded (inf)."""
  if is_url(directory):
    return float("inf")
  return shutil.disk_usage(_plain(directory)).free
