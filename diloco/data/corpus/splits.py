"""A prepared corpus as a run's data (data.source=corpus): its manifests checked, its validation
corpus in memory, and the streamed reader of one process (data/pipeline.py assembles them)."""

from __future__ import annotations

import dataclasses
import logging
import os

import grain
import ml_collections

from diloco.data import archive as archive_lib, shards, sources
from diloco.data.corpus import manifest as manifest_lib, stream

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class CorpusSplits:
  """A prepared corpus (data/corpus/): its manifest, streamed per reader at training time, and
  its validation corpus in memory, each document followed by the end-of-document id."""

  directory: str
  manifest: manifest_lib.Manifest
  val: sources.TokenCorpus
  vocab_size: int
  eod_id: int
  bytes_per_token: float  # validation text bytes over its tokens, end-of-document ids included
  cache_dir: str  # where a reader copies its shards of a bucket


def check(cfg: ml_collections.ConfigDict) -> tuple[manifest_lib.Manifest, manifest_lib.Manifest]:
  """The training and validation manifests of data.source=corpus, checked (every shard there at
  its size, ids below the vocabulary, one tokenizer): ValueError naming the file otherwise. Cheap
  (no shard is read): train.py calls it before the workdir is touched."""
  if not cfg.corpus or not cfg.val_corpus:
    raise ValueError(
        "data.source='corpus' needs data.corpus and data.val_corpus (prepared corpora)"
    )
  train, val = manifest_lib.read(cfg.corpus), manifest_lib.read(cfg.val_corpus)
  manifest_lib.check(cfg.corpus, train)
  manifest_lib.check(cfg.val_corpus, val, vocab_size=train.vocab_size)
  manifest_lib.check_tokenizer(cfg.val_corpus, val, train.tokenizer["sha256"], cfg.corpus)
  return train, val


def load(cfg: ml_collections.ConfigDict) -> CorpusSplits:
  """The checked manifests and the validation corpus read whole."""
  train, val = check(cfg)
  cache = os.path.join(archive_lib.resolve_cache_dir(cfg.cache_dir), "corpus")
  names, docs = stream.load_documents(cfg.val_corpus, val, os.path.join(cache, "val"))
  text_bytes = sum(s.text_bytes for s in val.shards)
  corpus = sources.TokenCorpus.from_documents(names, docs, [0] * len(docs))
  return CorpusSplits(
      cfg.corpus,
      train,
      corpus,
      train.vocab_size,
      train.eod_id,
      text_bytes / len(corpus.tokens) if text_bytes else 1.0,
      cache,
  )


def describe(splits: CorpusSplits) -> dict:
  """What summary.json's `data` says of the corpus (without the evaluation sample's fields)."""
  m = splits.manifest
  out = {"source": "corpus", "corpus": splits.directory, "tokenizer": m.tokenizer}
  out.update(vocab_size=m.vocab_size, eod_id=m.eod_id, train_shards=len(m.shards))
  out.update(train_tokens=m.tokens, train_documents=m.documents)
  out.update(val_tokens=len(splits.val.tokens), val_documents=len(splits.val.names))
  return out


def reader(
    splits: CorpusSplits,
    *,
    iid: bool,
    seed: int,
    global_batch_size: int,
    seq_len: int,
    shard_index: int,
    num_shards: int,
    process_index: int,
    process_count: int,
) -> tuple[grain.IterDataset, list[int]]:
  """This process's training batches and the shards it reads: the ones dealt to it by learner,
  then by process in its island (with `iid` every learner's processes share all of them, each
  learner in its own order)."""
  shards.check_shard(shard_index, num_shards)
  if global_batch_size % process_count:
    raise ValueError(
        f"batch_size={global_batch_size} does not split over {process_count} processes"
    )
  iid = iid or num_shards == 1
  readers = process_count if iid else num_shards * process_count
  index = process_index if iid else shard_index * process_count + process_index
  m = splits.manifest
  mine = stream.assign(len(m.shards), readers)[index]
  paths = stream.local_shards(splits.directory, m, mine, splits.cache_dir)
  dataset = stream.dataset(
      paths,
      [m.shards[i] for i in mine],
      m,
      seed=seed * 1_000_003 + shard_index,
      seq_len=seq_len,
      batch_size=global_batch_size // process_count,
  )
  _log.info(
      "Corpus %s shard %d of %d, process %d: shards %s.",
      splits.directory, shard_index, num_shards, process_index, mine,
  )  # fmt: skip
  return dataset, mine
