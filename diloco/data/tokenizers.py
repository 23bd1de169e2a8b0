"""Tokenizers: raw bytes (the default, vocabulary 256) and SentencePiece trained on the train split.

Bits per byte from a mean loss in nats per token: bpb = loss / ln 2 / bytes_per_token, where
bytes_per_token = (bytes of text) / (tokens it encodes to), measured on the evaluation text.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import numpy as np
import sentencepiece as spm

BYTE_VOCAB_SIZE = 256


class Tokenizer(Protocol):
  """What the pipeline needs from a tokenizer."""

  vocab_size: int

  def encode(self, data: bytes) -> np.ndarray:
    """Token ids of data, 1-D, an unsigned or int32 dtype."""

  def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
    """The bytes that ids encode."""


def bytes_per_token(tokenizer: Tokenizer, texts: Iterable[bytes]) -> float:
  """Total bytes / total tokens over texts (1.0 for the byte tokenizer)."""
  num_bytes = num_tokens = 0
  for text in texts:
    num_bytes += len(text)
    num_tokens += len(tokenizer.encode(text))
  if num_tokens == 0:
    raise ValueError("cannot measure bytes per token on empty text")
  return num_bytes / num_tokens


class ByteTokenizer:
  """Identity on bytes: token i is byte value i."""

  vocab_size = BYTE_VOCAB_SIZE

  def encode(self, data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)

  def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= BYTE_VOCAB_SIZE):
      raise ValueError(f"byte token ids must be in [0, 256), got range [{ids.min()}, {ids.max()}]")
    return ids.astype(np.uint8).tobytes()


class SentencePieceTokenizer:
  """A SentencePiece model that round-trips any UTF-8 text exactly (identity normalization)."""

  def __init__(self, model_path: str | os.PathLike):
    self.model_path = pathlib.Path(model_path)
    if not self.model_path.is_file():
      raise ValueError(f"SentencePiece model {str(self.model_path)!r} does not exist")
    self._sp = spm.SentencePieceProcessor(model_file=str(self.model_path))
    self.vocab_size: int = self._sp.vocab_size()

  def encode(self, data: bytes) -> np.ndarray:
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"SentencePiece tokenizer needs UTF-8 text: {e}") from e
    return np.asarray(self._sp.encode(text), dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
    return self._sp.decode(np.asarray(ids).tolist()).encode("utf-8")


def _lines(source: str | os.PathLike | Iterable[str | bytes]) -> Iterator[str]:
  if isinstance(source, (str, os.PathLike)):
    with open(source, encoding="utf-8") as f:
      yield from f
  else:
    for item in source:
      yield item.decode("utf-8") if isinstance(item, bytes) else item


def train_sentencepiece(
    source: str | os.PathLike | Iterable[str | bytes],
    vocab_size: int,
    model_prefix: str | os.PathLike,
) -> SentencePieceTokenizer:
  """Trains a BPE model on a text file or an iterator of sentences; writes model_prefix + '.model'.

  Identity normalization, no dummy prefix and byte fallback make encode/decode lossless, so
  bytes_per_token is measured on the exact text. The vocabulary needs room for the 256 byte pieces
  and <unk> besides one piece per distinct character, so vocab_size must exceed 257 plus the
  character count (about 80 for Shakespeare); on a small text the model may come out smaller
  (hard_vocab_limit is off) and `vocab_size` reports the true size.
  """
  if vocab_size <= BYTE_VOCAB_SIZE + 1:
    raise ValueError(
        f"sp_vocab_size must be > {BYTE_VOCAB_SIZE + 1} (256 byte pieces + <unk>), "
        f"got {vocab_size}"
    )
  model_path = pathlib.Path(f"{model_prefix}.model")
  model_path.parent.mkdir(parents=True, exist_ok=True)
  proto = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=(line.rstrip("\n") for line in _lines(source)),
        model_writer=proto,
        vocab_size=vocab_size,
        model_type="bpe",
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        byte_fallback=True,
        character_coverage=1.0,
        hard_vocab_limit=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        num_threads=2,
        minloglevel=2,
    )
  except RuntimeError as e:  # e.g. the text has more distinct characters than the vocabulary allows
    raise ValueError(f"SentencePiece training with sp_vocab_size={vocab_size} failed: {e}") from e
  tmp = model_path.with_name(f".{model_path.name}.{os.getpid()}.tmp")
  tmp.write_bytes(proto.getvalue())
  os.replace(tmp, model_path)
  return SentencePieceTokenizer(model_path)


def cached_sentencepiece(
    texts: Sequence[bytes], vocab_size: int, cache_dir: str | os.PathLike
) -> SentencePieceTokenizer:
  """A model trained on texts, reused from cache_dir/tokenizers when the same texts were seen."""
  digest = hashlib.sha256()
  for text in texts:
    digest.update(hashlib.sha256(text).digest())
  prefix = pathlib.Path(cache_dir) / "tokenizers" / f"sp_bpe{vocab_size}_{digest.hexdigest()[:16]}"
  if pathlib.Path(f"{prefix}.model").is_file():
    return SentencePieceTokenizer(f"{prefix}.model")
  try:
    decoded = [text.decode("utf-8") for text in texts]
  except UnicodeDecodeError as e:
    raise ValueError(f"SentencePiece training needs UTF-8 text: {e}") from e
  lines = (line for text in decoded for line in text.splitlines())
  return train_sentencepiece(lines, vocab_size, prefix)
