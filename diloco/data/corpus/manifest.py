"""The manifest of a prepared corpus (OUTPUT/manifest.json): the tokenizer and its hash, the
vocabulary, the end-of-document id, how ids are stored, and per shard its documents, tokens,
bytes and sha256. Preparation writes it last, so a directory without one is not a corpus.

Shard format: ArrayRecord, one record per document holding its token ids as little-endian
`dtype` (uint16 when the vocabulary fits, else uint32), `group_size:1` for random access. The
end-of-document id is not stored: the reader puts it between documents.
"""

from __future__ import annotations

import dataclasses
import json

from diloco import errors, paths

NAME = "manifest.json"
FORMAT = "diloco-tokens-v1"
ARRAY_RECORD_OPTIONS = "group_size:1"  # one record per chunk: random access


def dtype_for(vocab_size: int) -> str:
  return "<u2" if vocab_size <= 1 << 16 else "<u4"


def shard_name(index: int, count: int) -> str:
  return f"shard-{index:05d}-of-{count:05d}.array_record"


@dataclasses.dataclass(frozen=True)
class Shard:
  name: str  # relative to the corpus directory
  documents: int
  tokens: int
  bytes: int
  sha256: str
  max_id: int  # the largest id it holds (-1: none)
  text_bytes: int = 0  # UTF-8 bytes of its documents' text (bits per byte = loss / bytes per token)
  whitespace_lost: int = 0  # newlines, tabs and carriage returns the tokenizer turned into spaces


@dataclasses.dataclass(frozen=True)
class Manifest:
  tokenizer: dict  # kind, path, sha256, vocab_size (`PretrainedTokenizer.describe`)
  vocab_size: int
  eod_id: int
  dtype: str
  shards: tuple[Shard, ...]
  source: dict  # inputs, format, field: what was prepared
  format: str = FORMAT

  @property
  def documents(self) -> int:
    return sum(s.documents for s in self.shards)

  @property
  def tokens(self) -> int:
    return sum(s.tokens for s in self.shards)

  def to_json(self) -> str:
    d = dataclasses.asdict(self)
    d["documents"], d["tokens"] = self.documents, self.tokens
    return json.dumps(d, indent=1)


def write(directory: str, manifest: Manifest) -> None:
  paths.write_bytes(paths.join(directory, NAME), manifest.to_json().encode())


def read(directory: str) -> Manifest:
  """The corpus manifest; ValueError naming the file when it is missing or malformed."""
  path = paths.join(directory, NAME)
  if not paths.exists(path):
    raise errors.InputError(
        f"{path} does not exist: {directory} is not a prepared corpus, or its preparation did "
        "not finish (python -m experiments.prepare)"
    )
  try:
    d = json.loads(paths.read_bytes(path))
    if d.get("format") != FORMAT:
      raise errors.InputError(f"format {d.get('format')!r}, expected {FORMAT!r}")
    shards = tuple(Shard(**s) for s in d["shards"])
    return Manifest(
        d["tokenizer"], int(d["vocab_size"]), int(d["eod_id"]), d["dtype"], shards, d["source"]
    )
  except (ValueError, KeyError, TypeError, AttributeError) as e:  # (AttributeError: not a dict)
    raise errors.InputError(f"{path} is not a corpus manifest: {type(e).__name__}: {e}") from e


def check(directory: str, manifest: Manifest, vocab_size: int | None = None) -> None:
  """Every shard is there with its recorded size and not empty, and no id reaches `vocab_size`
  (the model's): ValueError naming the file otherwise. Cheap: sizes, not contents (the reader
  checks each record's ids as it reads them)."""
  if vocab_size is not None and manifest.vocab_size > vocab_size:
    raise errors.InputError(
        f"{paths.join(directory, NAME)}: the corpus's vocabulary of {manifest.vocab_size} ids "
        f"does not fit the model's {vocab_size}"
    )
  sizes = paths.sizes(directory)  # (one listing, not a request per shard)
  for s in manifest.shards:
    path = paths.join(directory, s.name)
    if s.name not in sizes:
      raise errors.InputError(f"{path}: shard listed in the manifest is missing")
    if s.documents == 0:
      raise errors.InputError(f"{path}: shard holds no documents")
    have = sizes[s.name]
    if have != s.bytes:
      raise errors.InputError(
          f"{path}: {have} bytes, the manifest says {s.bytes} (truncated or replaced)"
      )
    if s.max_id >= manifest.vocab_size:
      raise errors.InputError(
          f"{path}: token id {s.max_id} is not below the vocabulary {manifest.vocab_size}"
      )


def check_tokenizer(directory: str, manifest: Manifest, sha256: str, path: str) -> None:
  """The tokenizer given to training is the one the corpus was prepared with."""
  if sha256 != manifest.tokenizer["sha256"]:
    raise errors.InputError(
        f"tokenizer {path} (sha256 {sha256[:12]}) is not the one {paths.join(directory, NAME)} "
        f"was prepared with ({manifest.tokenizer['path']}, sha256 {manifest.tokenizer['sha256'][:12]})"
    )
