"""Prepared corpora as a run's data (data.source=corpus): their manifests checked, the validation
corpus in memory, and the streamed reader of one process over one corpus or a mixture
(data/pipeline.py assembles them)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import grain
import ml_collections

from diloco import errors
from diloco.data import archive as archive_lib, shards, sources
from diloco.data.corpus import manifest as manifest_lib, mixture, stream, tokenizer_files

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainCorpus:
  """One corpus of the training mixture: where it is, its manifest, its share of the tokens."""

  directory: str
  manifest: manifest_lib.Manifest
  weight: float


@dataclasses.dataclass
class CorpusSplits:
  """Prepared corpora (data/corpus/): the training corpora, streamed per reader at training time
  (mixed by their weights), and the validation corpus in memory, each document followed by the
  end-of-document id."""

  train: tuple[TrainCorpus, ...]
  val: sources.TokenCorpus
  vocab_size: int
  eod_id: int
  bytes_per_token: float  # validation text bytes over its tokens, end-of-document ids included
  cache_dir: str  # where a reader copies its shards of a bucket

  @functools.cached_property
  def tokenizer(self) -> tokenizer_files.BytesTokenizer:
    """The tokenizer the corpora were prepared with, read when first asked for (scoring text
    files, sampling): training reads token ids only."""
    first = self.train[0]
    tok = tokenizer_files.load_recorded(first.manifest.tokenizer, self.eod_id, first.directory)
    return tokenizer_files.BytesTokenizer(tok)


def check(cfg: ml_collections.ConfigDict) -> tuple[tuple[TrainCorpus, ...], manifest_lib.Manifest]:
  """The training corpora (with their token shares) and the validation manifest of
  data.source=corpus, checked (every shard there at its size, ids below the vocabulary, one
  tokenizer and vocabulary for all): ValueError naming the file otherwise. Cheap (no shard is
  read): train.py calls it before the workdir is touched."""
  if not cfg.corpus or not cfg.val_corpus:
    raise errors.InputError(
        "data.source='corpus' needs data.corpus and data.val_corpus (prepared corpora)"
    )
  dirs = mixture.directories(cfg.corpus)
  manifests = [manifest_lib.read(d) for d in dirs]
  first = manifests[0]
  for d, m in zip(dirs, manifests):
    manifest_lib.check(d, m)
    if d != dirs[0]:
      manifest_lib.check_tokenizer(d, m, first.tokenizer["sha256"], dirs[0])
      if (m.vocab_size, m.eod_id) != (first.vocab_size, first.eod_id):
        raise errors.InputError(
            f"{d}: vocabulary {m.vocab_size} and end-of-document id {m.eod_id}, but {dirs[0]} "
            f"has {first.vocab_size} and {first.eod_id}: a mixture needs one tokenizer"
        )
  shares = mixture.weights(cfg.get("corpus_weights", ""), len(dirs), [m.tokens for m in manifests])
  val = manifest_lib.read(cfg.val_corpus)
  manifest_lib.check(cfg.val_corpus, val, vocab_size=first.vocab_size)
  manifest_lib.check_tokenizer(cfg.val_corpus, val, first.tokenizer["sha256"], dirs[0])
  train = tuple(TrainCorpus(d, m, w) for d, m, w in zip(dirs, manifests, shares))
  return train, val


def _cache_dir(cfg: ml_collections.ConfigDict) -> str:
  """Where readers keep their copies of a bucket's shards and their checks' notes."""
  return os.path.join(archive_lib.resolve_cache_dir(cfg.cache_dir), "corpus")


def load(cfg: ml_collections.ConfigDict) -> CorpusSplits:
  """The checked manifests and the validation corpus read whole."""
  train, val = check(cfg)
  cache = _cache_dir(cfg)
  names, docs = stream.load_documents(cfg.val_corpus, val, os.path.join(cache, "val"))
  text_bytes = sum(s.text_bytes for s in val.shards)
  corpus = sources.TokenCorpus.from_documents(names, docs, [0] * len(docs))
  return CorpusSplits(
      train,
      corpus,
      train[0].manifest.vocab_size,
      train[0].manifest.eod_id,
      text_bytes / len(corpus.tokens) if text_bytes else 1.0,
      cache,
  )


def describe(splits: CorpusSplits) -> dict:
  """What summary.json's `data` says of the corpora (without the evaluation sample's fields)."""
  train = splits.train
  out = {"source": "corpus", "corpus": ",".join(t.directory for t in train)}
  out.update(tokenizer=train[0].manifest.tokenizer, vocab_size=splits.vocab_size)
  out.update(eod_id=splits.eod_id, train_shards=sum(len(t.manifest.shards) for t in train))
  out.update(train_tokens=sum(t.manifest.tokens for t in train))
  out.update(train_documents=sum(t.manifest.documents for t in train))
  if len(train) > 1:
    out["weights"] = {t.directory: round(t.weight, 6) for t in train}
  out.update(val_tokens=len(splits.val.tokens), val_documents=len(splits.val.names))
  return out


def _dealt(t: TrainCorpus, iid, shard_index, num_shards, process_index, process_count) -> list[int]:
  """The shards of `t` that learner `shard_index`'s process reads."""
  iid = iid or num_shards == 1
  readers = process_count if iid else num_shards * process_count
  index = process_index if iid else shard_index * process_count + process_index
  try:
    return stream.assign(len(t.manifest.shards), readers)[index]
  except ValueError as e:
    raise errors.InputError(f"{t.directory}: {e}") from e


def fetch_own(
    cfg: ml_collections.ConfigDict,
    learners: list[int],
    num_shards: int,
    process_index: int,
    process_count: int,
) -> None:
  """`check`, then this process's shards of every corpus (those of its `learners`) copied from a
  bucket or, local, checked in place, each against its sha256: a corrupt shard is named before
  the run writes anything (each process reads only its own shards, once per file)."""
  train, _ = check(cfg)
  cache = _cache_dir(cfg)
  for t in train:
    mine = sorted(
        {
            i
            for m in learners
            for i in _dealt(t, cfg.iid, m, num_shards, process_index, process_count)
        }
    )
    stream.local_shards(t.directory, t.manifest, mine, cache)


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
) -> tuple[grain.IterDataset, list[stream.Source], list[str]]:
  """This process's training batches, what it reads of each corpus and those shards' names (a
  mixture's prefixed with their corpus): of each corpus, the shards dealt to
  it by learner, then by process in its island (with `iid` every learner's processes share all of
  them, each learner in its own order)."""
  shards.check_shard(shard_index, num_shards)
  if global_batch_size % process_count:
    raise errors.InputError(
        f"batch_size={global_batch_size} does not split over {process_count} processes"
    )
  where = (iid, shard_index, num_shards, process_index, process_count)
  sources_, mine, labels = [], [], []
  for t in splits.train:
    indices = _dealt(t, *where)
    paths = stream.local_shards(t.directory, t.manifest, indices, splits.cache_dir)
    sources_.append(stream.Source(paths, [t.manifest.shards[i] for i in indices], t.manifest))
    mine.append(indices)
    prefix = f"{t.directory}/" if len(splits.train) > 1 else ""
    labels += [f"{prefix}{t.manifest.shards[i].name}" for i in indices]
  weights = mixture.document_weights(
      [t.weight for t in splits.train],
      [sum(s.tokens for s in src.shards) for src in sources_],
      [sum(s.documents for s in src.shards) for src in sources_],
  )
  dataset = stream.mixed(
      sources_,
      weights,
      seed=seed * 1_000_003 + shard_index,
      seq_len=seq_len,
      batch_size=global_batch_size // process_count,
  )
  _log.info(
      "Corpus shard %d of %d, process %d: shards %s of %s.",
      shard_index, num_shards, process_index, mine, [t.directory for t in splits.train],
  )  # fmt: skip
  return dataset, sources_, labels
