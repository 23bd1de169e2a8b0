"""Token corpora and grain random-access sources: packed sequences, text files, ArrayRecord.

ArrayRecord shard format (what `write_array_record` writes and `read_array_record_docs` reads): one
record per document, holding that document's token ids as little-endian int32
(`np.asarray(ids, '<i4').tobytes()`), written with `group_size:1` so grain can read records at
random.
Documents are concatenated as they are, with no separator token added between them.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pathlib
from collections.abc import Iterable, Sequence

import grain
import numpy as np
from array_record.python import array_record_module

from diloco.data import tokenizers

ARRAY_RECORD_OPTIONS = "group_size:1"
_INT32 = np.dtype("<i4")


@dataclasses.dataclass(frozen=True)
class TokenCorpus:
  """1-D tokens cut into named documents: document i is tokens[starts[i]:starts[i + 1]]."""

  tokens: np.ndarray
  names: tuple[str, ...]
  starts: tuple[int, ...]  # len(names) + 1 entries, from 0 to len(tokens)
  doc_bytes: tuple[int, ...]  # bytes of text each document's tokens encode

  def __post_init__(self):
    if self.tokens.ndim != 1:
      raise ValueError(f"tokens must be 1-D, got shape {self.tokens.shape}")
    starts = self.starts
    if (
        len(starts) != len(self.names) + 1
        or starts[0] != 0
        or starts[-1] != len(self.tokens)
        or any(a > b for a, b in zip(starts, starts[1:]))
    ):
      raise ValueError(
          f"document starts {starts[:5]}... do not partition {len(self.tokens)} tokens"
      )
    if len(self.doc_bytes) != len(self.names):
      raise ValueError(f"{len(self.doc_bytes)} byte counts for {len(self.names)} documents")

  @classmethod
  def from_documents(
      cls, names: Sequence[str], docs: Sequence[np.ndarray], doc_bytes: Sequence[int]
  ) -> TokenCorpus:
    """Concatenates the documents' token arrays in order."""
    if len(names) != len(docs):
      raise ValueError(f"{len(names)} names for {len(docs)} documents")
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs], dtype=np.int64)])
    tokens = np.concatenate(docs) if docs else np.zeros(0, np.uint8)
    return cls(
        tokens, tuple(names), tuple(int(s) for s in starts), tuple(int(b) for b in doc_bytes)
    )

  @property
  def num_bytes(self) -> int:
    return sum(self.doc_bytes)

  @property
  def doc_sizes(self) -> list[int]:
    """Tokens per document."""
    return [b - a for a, b in zip(self.starts, self.starts[1:])]

  def doc(self, i: int) -> np.ndarray:
    return self.tokens[self.starts[i] : self.starts[i + 1]]

  def select(self, doc_ids: Sequence[int]) -> TokenCorpus:
    """A new corpus of the chosen documents, in the order given."""
    return TokenCorpus.from_documents(
        [self.names[i] for i in doc_ids],
        [self.doc(i) for i in doc_ids],
        [self.doc_bytes[i] for i in doc_ids],
    )


class PackedTokenSource:
  """Record i is tokens[i*L : i*L + L + 1] as int32, so inputs = r[:-1] and targets = r[1:].

  Sequences are packed back to back across document boundaries; the tail that does not fill a last
  record is dropped. Works with `grain.MapDataset.source(...)`.
  """

  def __init__(self, tokens_1d: np.ndarray, seq_len: int):
    if seq_len < 1:
      raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    tokens_1d = np.asarray(tokens_1d) if not isinstance(tokens_1d, np.ndarray) else tokens_1d
    if tokens_1d.ndim != 1:
      raise ValueError(f"tokens must be 1-D, got shape {tokens_1d.shape}")
    if len(tokens_1d) < seq_len + 1:
      raise ValueError(
          f"{len(tokens_1d)} tokens cannot fill one sequence of seq_len={seq_len} "
          f"(needs {seq_len + 1})"
      )
    self.tokens = tokens_1d
    self.seq_len = seq_len
    self._num_records = (len(tokens_1d) - 1) // seq_len
    self._offsets_L = np.arange(seq_len, dtype=np.int64)

  def __len__(self) -> int:
    return self._num_records

  def __getitem__(self, index: int) -> np.ndarray:
    index = int(index)
    if not 0 <= index < self._num_records:
      raise IndexError(f"record {index} out of range [0, {self._num_records})")
    start = index * self.seq_len
    return self.tokens[start : start + self.seq_len + 1].astype(np.int32)

  def __repr__(self) -> str:
    return f"PackedTokenSource(tokens={len(self.tokens)}, seq_len={self.seq_len})"

  def batch(self, records_B: np.ndarray) -> dict[str, np.ndarray]:
    """{'inputs_BxL', 'targets_BxL'} (int32, contiguous) of the given records, in one gather."""
    starts_Bx1 = (np.asarray(records_B, dtype=np.int64) * self.seq_len)[:, None]
    idx_BxL = starts_Bx1 + self._offsets_L
    return {
        "inputs_BxL": self.tokens[idx_BxL].astype(np.int32),
        "targets_BxL": self.tokens[idx_BxL + 1].astype(np.int32),
    }


def glob_files(pattern: str, what: str) -> list[str]:
  """Sorted regular files matching pattern (** recurses); ValueError if there are none."""
  if not pattern:
    raise ValueError(f"{what} is empty; set it to a glob of files")
  paths = sorted(
      p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p)
  )
  if not paths:
    raise ValueError(f"{what}={pattern!r} matches no files")
  return paths


def shared_file(pattern: str, other: str) -> str | None:
  """The first file (in sorted order) that both globs match, or None."""
  match = lambda p: {
      os.path.realpath(f): f
      for f in glob.glob(os.path.expanduser(p), recursive=True)
      if os.path.isfile(f)
  }
  mine, theirs = match(pattern), match(other)
  both = sorted(mine.keys() & theirs.keys())
  return theirs[both[0]] if both else None


def read_text_files(pattern: str, what: str = "text_glob") -> list[tuple[str, bytes]]:
  """(path, raw bytes) of every file matching pattern, in sorted path order."""
  return [(p, pathlib.Path(p).read_bytes()) for p in glob_files(pattern, what)]


def write_array_record(path: str | os.PathLike, docs: Iterable[Sequence[int] | np.ndarray]) -> int:
  """Writes one record per document (little-endian int32 ids); returns the number of records."""
  writer = array_record_module.ArrayRecordWriter(str(path), ARRAY_RECORD_OPTIONS)
  count = 0
  try:
    for doc in docs:
      ids = np.asarray(doc)
      if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ValueError(
            f"document {count} must be a 1-D sequence of integers, got "
            f"shape {ids.shape} dtype {ids.dtype}"
        )
      if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise ValueError(f"document {count} has token ids outside [0, 2**31)")
      writer.write(ids.astype(_INT32).tobytes())
      count += 1
  finally:
    writer.close()
  return count


def read_array_record_docs(paths: Sequence[str]) -> list[np.ndarray]:
  """Every record of the shards, in path order then record order, as int32 token arrays."""
  if not paths:
    raise ValueError("no ArrayRecord paths given")
  source = grain.sources.ArrayRecordDataSource(list(paths))
  records = source.__getitems__(range(len(source))) if len(source) else []
  docs = []
  for i, record in enumerate(records):
    if len(record) % _INT32.itemsize:
      raise ValueError(
          f"ArrayRecord record {i} of {list(paths)} has {len(record)} bytes, not a "
          "whole number of int32 token ids; see diloco.data.sources for the format"
      )
    docs.append(np.frombuffer(record, dtype=_INT32).astype(np.int32))
  return docs


@dataclasses.dataclass(frozen=True)
class Splits:
  """Tokenized training and validation documents, before sharding and batching."""

  train: TokenCorpus
  val: TokenCorpus
  vocab_size: int
  tokenizer: tokenizers.Tokenizer = tokenizers.ByteTokenizer()  # what encoded them
