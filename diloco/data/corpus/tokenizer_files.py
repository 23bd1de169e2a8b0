"""Pretrained tokenizers from a file (a SentencePiece `.model`, a Hugging Face `tokenizers`
`tokenizer.json`) on any file system fsspec serves, and the command that trains one (SentencePiece
BPE or byte-level BPE) once, before any preparation or training.

Every loaded tokenizer carries the sha256 of its file (the manifest records it; training compares)
and its end-of-document id: the model's own end-of-sequence piece, or the token named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
from collections.abc import Iterable, Sequence

import fsspec
import numpy as np

from diloco import errors, paths

TRAINABLE = ("sentencepiece", "bpe")
# Names an end-of-document token goes by, tried in order when none is named.
EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
TRAINED_EOD = "<|endoftext|>"  # what `train` adds


def kind_of(path: str) -> str:
  """'sentencepiece' for a .model file, 'hf' for a .json file; ValueError otherwise."""
  if path.endswith(".model"):
    return "sentencepiece"
  if path.endswith(".json"):
    return "hf"
  raise errors.InputError(
      f"tokenizer {path!r}: name a SentencePiece .model or a Hugging Face tokenizer.json"
  )


@dataclasses.dataclass
class PretrainedTokenizer:
  """A tokenizer read from `path`: ids of text, and what a manifest records of it."""

  kind: str
  path: str
  sha256: str
  vocab_size: int
  eod_id: int
  _impl: object = dataclasses.field(repr=False, default=None)

  def encode(self, text: str) -> np.ndarray:
    if self.kind == "sentencepiece":
      return np.asarray(self._impl.encode(text), np.int64)
    return np.asarray(self._impl.encode(text, add_special_tokens=False).ids, np.int64)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    if self.kind == "sentencepiece":
      return [np.asarray(ids, np.int64) for ids in self._impl.encode(list(texts))]
    encoded = self._impl.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, np.int64) for e in encoded]

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self._impl.decode([int(i) for i in ids])

  def describe(self) -> dict:
    """What a manifest records."""
    return {
        "kind": self.kind,
        "path": self.path,
        "sha256": self.sha256,
        "vocab_size": self.vocab_size,
    }


@dataclasses.dataclass
class BytesTokenizer:
  """A pretrained tokenizer as the pipeline's `tokenizers.Tokenizer`: UTF-8 bytes in and out
  (bytes that are not UTF-8 are replaced), for scoring text files and sampling a finished run."""

  pretrained: PretrainedTokenizer

  @property
  def vocab_size(self) -> int:
    return self.pretrained.vocab_size

  @property
  def eod_id(self) -> int:
    return self.pretrained.eod_id

  def encode(self, data: bytes) -> np.ndarray:
    return self.pretrained.encode(data.decode("utf-8", errors="replace"))

  def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
    return self.pretrained.decode(ids).encode("utf-8")


def load_recorded(record: dict, eod_id: int, corpus: str) -> PretrainedTokenizer:
  """The tokenizer a manifest recorded (`PretrainedTokenizer.describe`) at its recorded path,
  with the manifest's end-of-document id: ValueError naming the corpus and the file when that
  file cannot be read or is not the one recorded (another sha256)."""
  path = record["path"]
  try:
    with fsspec.open(path, "rb") as f:
      data = f.read()
    impl = _open(record["kind"], data)[0]
  except Exception as e:  # missing (OSError), unreadable (each library's own error type)
    raise errors.InputError(
        f"{corpus} was prepared with tokenizer {path}, which cannot be read here "
        f"({type(e).__name__}: {e})"
    ) from e
  sha = hashlib.sha256(data).hexdigest()
  if sha != record["sha256"]:
    raise errors.InputError(
        f"{corpus} was prepared with tokenizer {path} of sha256 {record['sha256'][:12]}; the file "
        f"there now has sha256 {sha[:12]}"
    )
  return PretrainedTokenizer(record["kind"], path, sha, record["vocab_size"], eod_id, impl)


def load(path: str, eod_token: str | None = None) -> PretrainedTokenizer:
  """The tokenizer in `path`; its end-of-document id is `eod_token`'s, else the model's own
  end-of-sequence piece, else the first of EOD_NAMES it knows. ValueError naming the file when
  it is missing, unreadable or has none of those."""
  kind = kind_of(path)
  path = paths.absolute(path)  # what a manifest records: readable from any directory
  try:
    with fsspec.open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError as e:
    raise errors.InputError(f"tokenizer {path!r} does not exist") from e
  sha = hashlib.sha256(data).hexdigest()
  try:
    impl, vocab, own_eos, lookup = _open(kind, data)
  except Exception as e:  # each library raises its own error type on a file it cannot parse
    raise errors.InputError(f"tokenizer {path!r} is not a readable {kind} model: {e}") from e
  names = (eod_token,) if eod_token else EOD_NAMES
  eod = own_eos if (own_eos is not None and not eod_token) else None
  for name in names if eod is None else ():
    eod = lookup(name)
    if eod is not None:
      break
  if eod is None:
    wanted = repr(eod_token) if eod_token else f"an end-of-sequence piece or any of {EOD_NAMES}"
    raise errors.InputError(f"tokenizer {path!r} has no {wanted}: name its end-of-document token")
  return PretrainedTokenizer(kind, path, sha, vocab, int(eod), impl)


def _open(kind: str, data: bytes):
  """(model, vocabulary size, its own end-of-sequence id or None, token -> id or None)."""
  if kind == "sentencepiece":
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=data)
    unk = sp.unk_id()

    def lookup(name):
      i = sp.piece_to_id(name)
      return None if i == unk and name != sp.id_to_piece(unk) else i

    eos = sp.eos_id()
    return sp, sp.vocab_size(), (eos if eos >= 0 else None), lookup
  import tokenizers

  tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
  return tok, tok.get_vocab_size(with_added_tokens=True), None, tok.token_to_id


def train(kind: str, texts: Iterable[str], vocab_size: int, out_path: str) -> PretrainedTokenizer:
  """Trains a tokenizer on `texts` and writes it to `out_path` (.model for SentencePiece, .json
  for byte-level BPE), with TRAINED_EOD as its end-of-document token."""
  if kind not in TRAINABLE:
    raise errors.InputError(f"tokenizer kind must be one of {TRAINABLE}, got {kind!r}")
  want = ".model" if kind == "sentencepiece" else ".json"
  if not out_path.endswith(want):
    raise errors.InputError(f"a {kind} tokenizer is written to a {want} file, got {out_path!r}")
  paths.require_bucket(out_path, f"tokenizer {out_path!r}")
  if kind == "sentencepiece":
    data = _train_sentencepiece(texts, vocab_size)
  else:
    data = _train_bpe(texts, vocab_size)
  paths.write_bytes(out_path, data)
  return load(out_path)


def _train_sentencepiece(texts: Iterable[str], vocab_size: int) -> bytes:
  import sentencepiece as spm

  proto = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=(line for t in texts for line in t.splitlines() if line),
        model_writer=proto,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=0.9995,
        user_defined_symbols=[TRAINED_EOD],
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
  except RuntimeError as e:
    raise errors.InputError(
        f"SentencePiece training with vocab_size={vocab_size} failed: {e}"
    ) from e
  return proto.getvalue()


def _train_bpe(texts: Iterable[str], vocab_size: int) -> bytes:
  import tokenizers

  if vocab_size <= 257:
    raise errors.InputError(f"byte-level BPE needs vocab_size > 257 (256 bytes + {TRAINED_EOD})")
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(
      texts, vocab_size=vocab_size, special_tokens=[TRAINED_EOD], show_progress=False
  )
  return bpe.to_str().encode("utf-8")
