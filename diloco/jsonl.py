"""JSON Lines files the project appends to (metrics, progress, chaos and supervisor logs), made
safe against a crash in the middle of a write.

A writer appends a row and its newline in one write, so a crash can only leave the last line torn
(no newline at the end). `read` drops such a line when it does not parse, with a warning, and
names the file and line of any other line that does not parse; `open_append` first cuts a torn
tail off (or ends a whole last row with its missing newline), so the next row starts on a line of
its own.
"""

import json
import os
from typing import Any, TextIO

from absl import logging


def read(path: str) -> list[dict[str, Any]]:
  """The rows of `path`; a torn last line is dropped (logged); any other bad line: ValueError."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
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
  if not os.path.exists(path):
    return
  with open(path, "rb+") as f:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size == 0:
      return
    f.seek(max(0, size - (1 << 20)))
    tail = f.read()
    if tail.endswith(b"\n"):
      return
    cut = tail.rfind(b"\n")
    start = size - len(tail) + cut + 1 if cut >= 0 else size - len(tail)
    partial = tail[cut + 1 :]
    try:
      json.loads(partial)
    except ValueError:
      f.truncate(start)
      logging.warning(
          "%s: cut off a torn last line of %d bytes (a crash mid-write)", path, len(partial)
      )
      return
    f.write(b"\n")


def open_append(path: str) -> TextIO:
  """`path` opened for appending rows, after `repair`."""
  repair(path)
  return open(path, "a", encoding="utf-8")


def append(path: str, row: dict[str, Any]) -> None:
  """Appends one row (and its newline) in one write."""
  with open_append(path) as f:
    f.write(json.dumps(row, sort_keys=True) + "\n")
