"""Files of a prepared corpus on any file system fsspec serves: a local directory or a bucket
(gs://, s3://). Each write appears whole or not at all: a local file by rename, a bucket object
by the object store's own single upload."""

from __future__ import annotations

import os
import tempfile

import fsspec


def join(directory: str, name: str) -> str:
  return directory.rstrip("/") + "/" + name


def is_local(path: str) -> bool:
  fs, _ = fsspec.core.url_to_fs(path)
  return "file" in ((fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol)


def put_bytes(path: str, data: bytes) -> None:
  fs, p = fsspec.core.url_to_fs(path)
  if is_local(path):
    directory = os.path.dirname(os.path.abspath(p))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, p)
  else:
    fs.pipe_file(p, data)


def put_file(local_src: str, path: str) -> None:
  """Moves the local file `local_src` to `path`."""
  fs, p = fsspec.core.url_to_fs(path)
  if is_local(path):
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    os.replace(local_src, p)
  else:
    fs.put_file(local_src, p)
    os.remove(local_src)


def get_file(path: str, local_dst: str) -> None:
  """Copies `path` to the local file `local_dst`, in blocks (a shard need not fit in memory)."""
  fs, p = fsspec.core.url_to_fs(path)
  fs.get_file(p, local_dst)


def sizes(directory: str) -> dict[str, int]:
  """Name -> bytes of every file directly in `directory`, from one listing."""
  fs, p = fsspec.core.url_to_fs(directory)
  listed = fs.ls(p, detail=True)
  return {
      e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e["size"])
      for e in listed
      if e["type"] == "file"
  }


def read_bytes(path: str) -> bytes:
  fs, p = fsspec.core.url_to_fs(path)
  return fs.cat_file(p)


def exists(path: str) -> bool:
  fs, p = fsspec.core.url_to_fs(path)
  return fs.exists(p)


def size(path: str) -> int:
  fs, p = fsspec.core.url_to_fs(path)
  return int(fs.size(p))
