"""build_datasets: the training iterator and evaluation batches for one shard on one process.

Sharding for several learners (num_shards > 1):
  iid=False  each shard trains on its own whole documents (plays for Shakespeare, files for
             text_glob, records for array_record), assigned by `shards.balanced_assignment`
             (near-equal sizes).
  iid=True   every shard trains on the whole training split; shard i shuffles it with its own stream
             (seed, i), so shards see the same data in different orders, not disjoint slices.
The evaluation set is the same for every shard, batch size and mode (`eval_set`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import grain
import jax
import ml_collections
import numpy as np

from diloco.data import archive as archive_lib, images, shakespeare, shards, sources
from diloco.data import tokenizers
from diloco.data.corpus import splits as corpus_splits
from diloco.data.corpus.splits import CorpusSplits
from diloco.data.batching import EvalSet, TrainBatchSource
from diloco.data.held_out import eval_set
from diloco.data.sources import Splits

SOURCES = ("shakespeare", "text_glob", "array_record", "corpus", "digits", "npz_glob")
IMAGE_SOURCES = ("digits", "npz_glob")  # data/images.py: images and labels, not tokens
TOKENIZERS = ("byte", "sentencepiece")
VAL_FRACTION = 10  # without a validation glob, the last 1/10 of the files (records) is held out

_log = logging.getLogger(__name__)
_loaded: dict[str, Any] | None = None  # load_splits' results within `reuse_splits()`


@dataclasses.dataclass
class Datasets:
  """What the trainer consumes."""

  # Endless {'inputs_BxL', 'targets_BxL'} int32 [b, L], b = global batch / process count.
  train_iter: grain.DatasetIterator
  eval_set: EvalSet  # the fixed validation records every evaluation scores
  vocab_size: int  # classes, for images
  bytes_per_token: float  # of the validation text; bpb = loss / ln 2 / bytes_per_token (0: images)
  train_tokens: int  # tokens in this shard's training data
  shard_plays: tuple[str, ...]  # documents of this shard (play names for Shakespeare)
  train_dataset: grain.IterDataset  # iter() it again for a fresh iterator at batch 0
  image_shape: tuple[int, ...] = ()  # (H, W, C) of image data; () for text
  packed: bool = False  # batches pack documents: segment ids, positions, a loss mask


def _tokenize(
    names: list[str], texts: list[bytes], tok: tokenizers.Tokenizer
) -> sources.TokenCorpus:
  return sources.TokenCorpus.from_documents(
      names, [tok.encode(t) for t in texts], [len(t) for t in texts]
  )


def _tokenizer_for(
    cfg: ml_collections.ConfigDict, train_texts: list[bytes]
) -> tokenizers.Tokenizer:
  if cfg.tokenizer == "byte":
    return tokenizers.ByteTokenizer()
  return tokenizers.cached_sentencepiece(
      train_texts, cfg.sp_vocab_size, archive_lib.resolve_cache_dir(cfg.cache_dir)
  )


def _shakespeare_splits(cfg: ml_collections.ConfigDict, expected_sha256: str) -> Splits:
  corpus = shakespeare.ensure_prepared(cfg.cache_dir, cfg.archive, expected_sha256)
  sep = len(corpus.separator)
  splits = {}
  if cfg.tokenizer == "byte":  # the memmaps are the tokens: no copy
    for split in shakespeare.SPLITS:
      plays = corpus.plays(split)
      splits[split] = sources.TokenCorpus(
          corpus.tokens(split),
          tuple(p.name for p in plays),
          tuple(p.offset for p in plays) + (len(corpus.tokens(split)),),
          tuple(p.length + sep for p in plays),
      )
    return Splits(splits["train"], splits["val"], tokenizers.BYTE_VOCAB_SIZE)
  texts = {
      s: [bytes(corpus.tokens(s)[p.offset : p.offset + p.length + sep]) for p in corpus.plays(s)]
      for s in shakespeare.SPLITS
  }
  tok = _tokenizer_for(cfg, texts["train"])
  for split in shakespeare.SPLITS:
    splits[split] = _tokenize([p.name for p in corpus.plays(split)], texts[split], tok)
  return Splits(splits["train"], splits["val"], tok.vocab_size, tok)


def _hold_out(items: list, what: str) -> tuple[list, list]:
  if len(items) < 2:
    raise ValueError(
        f"cannot hold out validation data from {len(items)} {what}; give at least two "
        f"or set the matching val_*_glob"
    )
  n_val = max(1, len(items) // VAL_FRACTION)
  return items[:-n_val], items[-n_val:]


def _text_glob_splits(cfg: ml_collections.ConfigDict, expected_sha256: str) -> Splits:
  del expected_sha256  # only the Shakespeare archive has one
  files = sources.read_text_files(cfg.text_glob, "text_glob")
  if cfg.val_text_glob:
    val = sources.read_text_files(cfg.val_text_glob, "val_text_glob")
    val_paths = {p for p, _ in val}
    train = [(p, t) for p, t in files if p not in val_paths]  # overlapping globs: val wins
    if not train:
      raise ValueError("every text_glob file is also a val_text_glob file; no training data left")
  else:
    train, val = _hold_out(files, "text files")
  tok = _tokenizer_for(cfg, [text for _, text in train])
  return Splits(
      _tokenize([p for p, _ in train], [t for _, t in train], tok),
      _tokenize([p for p, _ in val], [t for _, t in val], tok),
      tok.vocab_size,
      tok,
  )


def _records_corpus(docs: list[np.ndarray], names: list[str]) -> sources.TokenCorpus:
  for name, doc in zip(names, docs):
    if doc.size and doc.max() >= tokenizers.BYTE_VOCAB_SIZE:
      raise ValueError(
          f"ArrayRecord {name} holds token id {doc.max()}; with tokenizer='byte' ids "
          f"must be bytes (< 256)"
      )
  return sources.TokenCorpus.from_documents(
      names, [d.astype(np.uint8) for d in docs], [len(d) for d in docs]
  )


def _array_record_splits(cfg: ml_collections.ConfigDict, expected_sha256: str) -> Splits:
  del expected_sha256
  if cfg.tokenizer != "byte":
    raise ValueError(
        "source='array_record' holds token ids already; only tokenizer='byte' (ids "
        "are bytes, vocabulary 256) is supported for it"
    )
  paths = sources.glob_files(cfg.array_record_glob, "array_record_glob")
  docs = sources.read_array_record_docs(paths)
  named = [(f"record_{i}", d) for i, d in enumerate(docs)]
  if cfg.val_array_record_glob:
    val_paths = sources.glob_files(cfg.val_array_record_glob, "val_array_record_glob")
    if set(val_paths) & set(paths):
      raise ValueError("array_record_glob and val_array_record_glob match the same files")
    train = named
    val = [(f"val_record_{i}", d) for i, d in enumerate(sources.read_array_record_docs(val_paths))]
  else:
    train, val = _hold_out(named, "ArrayRecord records")
  return Splits(
      _records_corpus([d for _, d in train], [n for n, _ in train]),
      _records_corpus([d for _, d in val], [n for n, _ in val]),
      tokenizers.BYTE_VOCAB_SIZE,
  )


_LOADERS = {
    "shakespeare": _shakespeare_splits,
    "corpus": lambda cfg, _: corpus_splits.load(cfg),
    "text_glob": _text_glob_splits,
    "array_record": _array_record_splits,
    "digits": lambda cfg, _: images.load_digits(cfg.cache_dir),
    "npz_glob": lambda cfg, _: images.load_npz(cfg.npz_glob, cfg.val_npz_glob),
}


def _check_config(cfg: ml_collections.ConfigDict) -> None:
  if cfg.source not in SOURCES:
    raise ValueError(f"data.source={cfg.source!r}; expected one of {SOURCES}")
  if cfg.tokenizer not in TOKENIZERS:
    raise ValueError(f"data.tokenizer={cfg.tokenizer!r}; expected one of {TOKENIZERS}")
  for key in ("eval_sequences", "final_eval_sequences"):
    if cfg[key] < 0:
      raise ValueError(f"data.{key} must be >= 0 (0 = the whole split), got {cfg[key]}")
  if cfg.eval_batch_size < 1:
    raise ValueError(f"data.eval_batch_size must be >= 1, got {cfg.eval_batch_size}")


def shard_corpus(
    train: sources.TokenCorpus, shard_index: int, num_shards: int, iid: bool
) -> sources.TokenCorpus:
  """This shard's training documents (see the module docstring)."""
  shards.check_shard(shard_index, num_shards)
  if iid or num_shards == 1:
    return train
  return train.select(shards.balanced_assignment(train.doc_bytes, num_shards)[shard_index])


def load_splits(
    data_cfg: ml_collections.ConfigDict, expected_sha256: str = archive_lib.SDIST_SHA256
) -> Splits | images.ImageSplits:
  """Reads (preparing if needed) and tokenizes the configured source's two splits; within
  `reuse_splits()`, once per data config."""
  _check_config(data_cfg)
  if _loaded is None:
    return _LOADERS[data_cfg.source](data_cfg, expected_sha256)
  key = json.dumps([data_cfg.to_dict(), expected_sha256], sort_keys=True, default=str)
  if key not in _loaded:
    _loaded[key] = _LOADERS[data_cfg.source](data_cfg, expected_sha256)
  return _loaded[key]


@contextlib.contextmanager
def reuse_splits() -> Iterator[None]:
  """Within it, `load_splits` reads and tokenizes each data config once (one run's islands, its
  summary and the runs of mode=compare share the splits); outside it, every call reads the files."""
  global _loaded
  outermost = _loaded is None
  if outermost:
    _loaded = {}
  try:
    yield
  finally:
    if outermost:
      _loaded = None


def make_datasets(
    splits: Splits,
    data_cfg: ml_collections.ConfigDict,
    *,
    seed: int,
    global_batch_size: int,
    seq_len: int,
    shard_index: int = 0,
    num_shards: int = 1,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Datasets:
  """Shards, packs and batches loaded splits (the second half of build_datasets)."""
  _check_config(data_cfg)
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if isinstance(splits, images.ImageSplits):
    where = dict(shard_index=shard_index, num_shards=num_shards)
    where.update(process_index=process_index, process_count=process_count)
    return _image_datasets(
        splits, data_cfg, seed=seed, global_batch_size=global_batch_size, **where
    )
  if seq_len < 1:
    raise ValueError(f"seq_len must be >= 1, got {seq_len}")
  if isinstance(splits, CorpusSplits):
    where = dict(shard_index=shard_index, num_shards=num_shards)
    where.update(process_index=process_index, process_count=process_count)
    return _corpus_datasets(
        splits, data_cfg, seed=seed, global_batch_size=global_batch_size, seq_len=seq_len, **where
    )
  train = shard_corpus(splits.train, shard_index, num_shards, data_cfg.iid)
  packed_train = sources.PackedTokenSource(train.tokens, seq_len)
  where = dict(process_index=process_index, process_count=process_count)
  dataset = _batched(packed_train, seed, global_batch_size, shard_index, **where)
  _log.info(
      "Data %s/%s shard %d of %d: %d training tokens in %d documents, %d validation tokens.",
      *(data_cfg.source, data_cfg.tokenizer, shard_index, num_shards),
      *(len(train.tokens), len(train.names), len(splits.val.tokens)),
  )
  return Datasets(
      train_iter=iter(dataset),
      eval_set=eval_set(splits, data_cfg, seq_len=seq_len, **where),
      vocab_size=splits.vocab_size,
      bytes_per_token=splits.val.num_bytes / len(splits.val.tokens),
      train_tokens=len(train.tokens),
      shard_plays=train.names,
      train_dataset=dataset,
  )


def _batched(train, seed, global_batch_size, shard_index, *, process_index, process_count):
  """The endless training batches of `train` (grain, checkpointable)."""
  batches = TrainBatchSource(
      train,
      seed=seed,
      global_batch_size=global_batch_size,
      process_index=process_index,
      process_count=process_count,
      stream=shard_index,
  )
  # Batches are assembled in one numpy gather; threads would only contend for the GIL.
  dataset = grain.MapDataset.source(batches).to_iter_dataset(
      grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  )
  return dataset


def _corpus_datasets(splits: CorpusSplits, data_cfg, *, seq_len, **where) -> Datasets:
  """Datasets streamed from a prepared corpus (`corpus_splits.reader`)."""
  dataset, read, names = corpus_splits.reader(splits, iid=data_cfg.iid, seq_len=seq_len, **where)
  processes = dict(process_index=where["process_index"], process_count=where["process_count"])
  return Datasets(
      train_iter=iter(dataset),
      eval_set=eval_set(splits, data_cfg, seq_len=seq_len, **processes),
      vocab_size=splits.vocab_size,
      bytes_per_token=splits.bytes_per_token,
      train_tokens=sum(s.tokens for src in read for s in src.shards),
      shard_plays=tuple(names),
      train_dataset=dataset,
      packed=True,
  )


def _image_datasets(
    splits: images.ImageSplits,
    data_cfg,
    *,
    seed,
    global_batch_size,
    shard_index,
    num_shards,
    process_index,
    process_count,
) -> Datasets:
  """Datasets of images: batches of this shard's images (one 'token' is one image)."""
  train = images.shard(splits.train, shard_index, num_shards, data_cfg.iid)
  where = dict(process_index=process_index, process_count=process_count)
  dataset = _batched(train, seed, global_batch_size, shard_index, **where)
  return Datasets(
      train_iter=iter(dataset),
      eval_set=eval_set(splits, data_cfg, seq_len=0, **where),
      vocab_size=splits.num_classes,
      bytes_per_token=0.0,
      train_tokens=len(train),
      shard_plays=tuple(f"class {c}" for c in np.unique(train.labels_N)),
      train_dataset=dataset,
      image_shape=splits.image_shape,
  )


def build_datasets(data_cfg: ml_collections.ConfigDict, **kwargs) -> Datasets:
  """Training iterator and evaluation batches for shard `shard_index`, this process's rows only:
  `make_datasets` (which takes the same keywords) of the loaded splits."""
  return make_datasets(load_splits(data_cfg), data_cfg, **kwargs)
