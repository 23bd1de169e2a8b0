"""JSON Lines files the project appends to (metrics, progress, chaos and supervisor logs), made
safe against a crash in the middle of a write.

A writer appends a row and its newline in one write, so a crash can only leave the last line torn
(no newline at the end). `read` drops such a line when it does not parse, with a warning, and
names the file and line of any other line that does not parse; `open_append` first cuts a torn
tail off (or ends a whole last row with its missing newline), so the next row starts on a line of
its own.

A bucket object cannot be appended to: a file in a bucket is held in memory and uploaded whole,
at most every `UPLOAD_S` seconds as rows arrive and at `close` (`BucketAppend`); a row reaches
the bucket within UPLOAD_S of the next write or at the close.
"""

import json
import os
import time
from typing import Any, TextIO

from absl import logging

from diloco import paths

UPLOAD_S = 10.0  # a bucket file is uploaded whole at most this often while rows arrive


def read(path: str) -> list[dict[str, Any]]:
  """The rows of `path`; a torn last line is dropped (logged); any other bad line: ValueError."""
  text = paths.read_text(path)
  lines = text.split("\n")
  torn = lines.pop() if lines else ""  # the text after the last newline: "" when whole
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except ValueError as e:
      raise ValueError(f"{path}, line {number}: not a JSON object ({e})") from e
  if torn.strip():
    try:
      rows.append(json.loads(torn))
    except ValueError:
      logging.warning(
          "%s: its last line (%d bytes) was cut off mid-write (a crash); dropped",
          path,
          len(torn.encode("utf-8")),
      )
  return rows


def repair(path: str) -> None:
  """Makes `path` end at a line boundary: a torn last line is cut off (logged), a whole last row
  without its newline gets one."""
  if paths.is_url(path):
    if paths.exists(path):
      paths.write_bytes(path, _whole_lines(paths.read_bytes(path), path))
    return
  if not os.path.exists(path):
    return
  with open(path, "rb+") as f:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - (1 << 20)))
    tail = f.read()
    whole = _whole_lines(tail, path)
    if len(whole) < len(tail):  # a torn last line: cut off
      f.truncate(size - len(tail) + len(whole))
    elif len(whole) > len(tail):  # a whole last row: its newline
      f.write(b"\n")


def _whole_lines(data: bytes, path: str) -> bytes:
  """`data` ending at a line boundary: a torn last line cut off (logged), a whole last row given
  its newline (`repair`'s rule, for a file's tail or a bucket object held in memory)."""
  if not data or data.endswith(b"\n"):
    return data
  cut = data.rfind(b"\n")
  partial = data[cut + 1 :]
  try:
    json.loads(partial)
  except ValueError:
    logging.warning(
        "%s: cut off a torn last line of %d bytes (a crash mid-write)", path, len(partial)
    )
    return data[: cut + 1]
  return data + b"\n"


class BucketAppend:
  """A bucket file opened for appending: its text in memory, uploaded whole (see the module doc)."""

  def __init__(self, path: str, keep_bytes: int | None = None):
    """`keep_bytes`: the file's first bytes to keep (a resume's cut); default all of them."""
    self.path = path
    data = paths.read_bytes(path) if paths.exists(path) else b""
    data = _whole_lines(data if keep_bytes is None else data[:keep_bytes], path)
    self._parts, self._size, self._uploaded_at = [data], len(data), 0.0
    self._dirty = keep_bytes is not None or data != b""

  def write(self, text: str) -> int:
    data = text.encode("utf-8")
    self._parts.append(data)
    self._size += len(data)
    self._dirty = True
    return len(text)

  def flush(self) -> None:
    if self._dirty and time.monotonic() - self._uploaded_at >= UPLOAD_S:
      self.upload()

  def upload(self) -> None:
    """Uploads the whole file now (if anything changed since the last upload)."""
    if not self._dirty:
      return
    data = b"".join(self._parts)
    self._parts = [data]
    paths.write_bytes(self.path, data)
    self._uploaded_at, self._dirty = time.monotonic(), False

  def tell(self) -> int:
    return self._size

  def close(self) -> None:
    self.upload()

  def __enter__(self) -> "BucketAppend":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def open_append(path: str) -> TextIO | BucketAppend:
  """`path` opened for appending rows, after `repair`."""
  if paths.is_url(path):
    return BucketAppend(path)
  repair(path)
  return open(path, "a", encoding="utf-8")


def append(path: str, row: dict[str, Any]) -> None:
  """Appends one row (and its newline) in one write."""
  with open_append(path) as f:
    f.write(json.dumps(row, sort_keys=True) + "\n")
