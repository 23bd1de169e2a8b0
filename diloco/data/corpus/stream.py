"""Training batches streamed from a prepared corpus (manifest.py), one reader per process.

Reader r of R reads only the shards `assign` deals it (round robin; R = learners x processes per
learner, r = learner x processes + process), whole shards, so a reader of a bucket fetches only
its own (`local_shards`). Its documents are shuffled with its own seed, a new order each epoch,
each followed by the end-of-document id, concatenated and split into sequences of seq_len + 1
tokens (grain's ConcatThenSplitIterDataset), with the segment id (1, 2, ... per sequence) and the
position in its document of every token. Across a join the loss is not taken: the
end-of-document token predicts nothing (`targets_mask_BxL` is 0 where the target lies in another
document than its input). Ids are checked against the vocabulary as each record is read (a bad
one names its shard and record). The reader's position is grain iterator state. Several
corpora are mixed document by document (`mixed`, mixture.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import grain
import numpy as np

from diloco import errors, paths
from diloco.data.corpus import manifest as manifest_lib, mixture


def assign(num_shards: int, readers: int) -> list[list[int]]:
  """The shard indices of each reader, round robin; every reader gets at least one."""
  if readers < 1:
    raise errors.InputError(f"readers must be >= 1, got {readers}")
  if num_shards < readers:
    raise errors.InputError(
        f"{num_shards} shards cannot give each of {readers} readers (learners x processes) "
        f"shards of its own: prepare the corpus with --shards={readers} or more"
    )
  return [list(range(r, num_shards, readers)) for r in range(readers)]


def local_shards(
    directory: str, m: manifest_lib.Manifest, indices: list[int], cache_dir: str
) -> list[str]:
  """Local paths of those shards, each checked against its sha256 once: a local corpus's in place
  (a note in cache_dir/verified keeps the check while the file's size and mtime stay); a bucket's
  copied once into cache_dir/shards (keyed by sha256). ValueError naming a shard that differs."""
  out = []
  for i in indices:
    shard = m.shards[i]
    path = paths.join(directory, shard.name)
    if paths.is_local(path):
      _verify_in_place(path, shard, cache_dir)
      out.append(path)
      continue
    local = os.path.join(cache_dir, "shards", f"{shard.sha256[:24]}.array_record")
    if not (os.path.exists(local) and os.path.getsize(local) == shard.bytes):
      os.makedirs(os.path.dirname(local), exist_ok=True)
      tmp = f"{local}.{os.getpid()}.tmp"
      paths.get_file(path, tmp)
      try:
        _check_digest(path, tmp, shard)
      except ValueError:
        os.remove(tmp)
        raise
      os.replace(tmp, local)
    out.append(local)
  return out


def _check_digest(name: str, local: str, shard: manifest_lib.Shard) -> None:
  with open(local, "rb") as f:
    digest = hashlib.file_digest(f, "sha256").hexdigest()
  if digest != shard.sha256:
    raise errors.InputError(
        f"{name}: sha256 {digest[:12]}, the manifest says {shard.sha256[:12]} (corrupt or replaced)"
    )


def _verify_in_place(path: str, shard: manifest_lib.Shard, cache_dir: str) -> None:
  """Checks a local shard's sha256 unless a note says this very file (path, size, mtime) was."""
  st = os.stat(path)
  seen = {"path": os.path.abspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
  note = os.path.join(cache_dir, "verified", f"{shard.sha256[:24]}.json")
  try:
    with open(note) as f:
      if json.load(f) == seen:
        return
  except (OSError, ValueError):
    pass
  _check_digest(path, path, shard)
  os.makedirs(os.path.dirname(note), exist_ok=True)
  with open(f"{note}.{os.getpid()}.tmp", "w") as f:
    json.dump(seen, f)
  os.replace(f"{note}.{os.getpid()}.tmp", note)


@dataclasses.dataclass(frozen=True)
class _Decode:
  """Record bytes -> {'tokens': ids + [eod], 'corpus': its corpus index per token} as int32,
  checked against the vocabulary."""

  names: tuple[str, ...]  # shard of each record run
  starts: tuple[int, ...]  # first global record index of each shard, then the total
  dtype: str
  vocab_size: int
  eod_id: int
  corpus: int = 0  # the corpus's index in a mixture

  def __call__(self, index: int, record: bytes) -> dict:
    ids = (
        np.frombuffer(record, self.dtype)
        if len(record) % np.dtype(self.dtype).itemsize == 0
        else None
    )
    if ids is None or (ids.size and int(ids.max()) >= self.vocab_size):
      s = int(np.searchsorted(self.starts, index, side="right")) - 1
      what = "a torn record" if ids is None else f"token id {int(ids.max())}"
      raise errors.InputError(
          f"{self.names[s]} record {index - self.starts[s]}: {what} (vocabulary {self.vocab_size})"
      )
    tokens = np.append(ids.astype(np.int32), np.int32(self.eod_id))
    return {"tokens": tokens, "corpus": np.full(tokens.shape, self.corpus, np.int32)}


@dataclasses.dataclass(frozen=True)
class Source:
  """One corpus of a reader: the local paths of its shards and their manifest entries."""

  paths: list[str]
  shards: list[manifest_lib.Shard]
  manifest: manifest_lib.Manifest


def _documents(src: Source, index: int, seed: int, vocab_size: int | None) -> grain.MapDataset:
  """The documents of one corpus, decoded, in a new shuffled order each epoch, endless."""
  counts = [s.documents for s in src.shards]
  m = src.manifest
  decode = _Decode(
      tuple(s.name for s in src.shards),
      tuple(int(x) for x in np.concatenate([[0], np.cumsum(counts)])),
      m.dtype,
      vocab_size if vocab_size is not None else m.vocab_size,
      m.eod_id,
      index,
  )
  records = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(src.paths))
  return records.map_with_index(decode).shuffle(seed=seed + 7919 * index).repeat(None)


def mixed(
    sources: list[Source],
    document_weights: list[float],
    *,
    seed: int,
    seq_len: int,
    batch_size: int,
    vocab_size: int | None = None,
) -> mixture.Counted:
  """Endless batches of `batch_size` packed sequences drawn from `sources` by
  `document_weights` (grain's mixing of documents; mixture.py turns token shares into them):
  {'inputs_BxL', 'targets_BxL', 'segment_ids_BxL', 'positions_BxL', 'targets_mask_BxL'}, all
  [batch_size, seq_len] int32; the iterator counts the tokens of each source."""
  if seq_len < 1 or batch_size < 1:
    raise errors.InputError(f"seq_len and batch_size must be >= 1, got {seq_len} and {batch_size}")
  docs = [_documents(src, i, seed, vocab_size) for i, src in enumerate(sources)]
  both = docs[0] if len(docs) == 1 else grain.MapDataset.mix(docs, list(document_weights))
  stream = both.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=64))
  packed = grain.experimental.ConcatThenSplitIterDataset(
      stream, length_struct={"tokens": seq_len + 1, "corpus": seq_len + 1}
  )
  return mixture.Counted(packed.batch(batch_size).map(_batch), len(sources))


def dataset(
    shard_paths: list[str],
    shards: list[manifest_lib.Shard],
    m: manifest_lib.Manifest,
    **kwargs,
) -> mixture.Counted:
  """`mixed` of one corpus: the shards at `shard_paths` (their manifest entries `shards`)."""
  return mixed([Source(shard_paths, shards, m)], [1.0], **kwargs)


def _batch(b: dict) -> dict:
  tokens, seg, pos = b["tokens"], b["tokens_segment_ids"], b["tokens_positions"]
  return {
      "inputs_BxL": tokens[:, :-1].astype(np.int32),
      "targets_BxL": tokens[:, 1:].astype(np.int32),
      "segment_ids_BxL": seg[:, :-1].astype(np.int32),
      "positions_BxL": pos[:, :-1].astype(np.int32),
      "targets_mask_BxL": (seg[:, 1:] == seg[:, :-1]).astype(np.int32),
      mixture.SOURCE: b["corpus"][:, :-1].astype(np.int32),
  }


def document_fields(inputs_BxL: np.ndarray, eod_id: int) -> dict[str, np.ndarray]:
  """Segment ids, positions and the loss mask of sequences cut from documents joined by
  `eod_id` (what `dataset` gives, for sequences that were not packed by it: evaluation's). A new
  segment starts after each end-of-document id; the mask drops the target it predicts."""
  is_eod_BxL = inputs_BxL == eod_id
  b, length = inputs_BxL.shape
  before_BxL = np.concatenate(
      [np.zeros((b, 1), np.int64), np.cumsum(is_eod_BxL, axis=1)[:, :-1]], 1
  )
  t_L = np.arange(length)
  starts_BxL = np.where(np.concatenate([np.ones((b, 1), bool), is_eod_BxL[:, :-1]], 1), t_L, 0)
  return {
      "segment_ids_BxL": (before_BxL + 1).astype(np.int32),
      "positions_BxL": (t_L - np.maximum.accumulate(starts_BxL, axis=1)).astype(np.int32),
      "targets_mask_BxL": (~is_eod_BxL).astype(np.int32),
  }


class PackedDocuments:
  """Evaluation records of a corpus's documents joined by `eod_id` (a `PackedTokenSource` whose
  batches carry `document_fields`)."""

  def __init__(self, tokens_1d: np.ndarray, seq_len: int, eod_id: int):
    from diloco.data import sources

    self._packed = sources.PackedTokenSource(tokens_1d, seq_len)
    self.eod_id = eod_id

  def __len__(self) -> int:
    return len(self._packed)

  def __getitem__(self, index: int) -> np.ndarray:
    return self._packed[index]

  def batch(self, records_B: np.ndarray) -> dict[str, np.ndarray]:
    out = self._packed.batch(records_B)
    return out | document_fields(out["inputs_BxL"], self.eod_id)


def load_documents(
    directory: str, m: manifest_lib.Manifest, cache_dir: str
) -> tuple[list[str], list[np.ndarray]]:
  """Every document of a (validation) corpus, each followed by the end-of-document id: shard
  names and arrays, in shard then record order. For a corpus that fits in memory."""
  from array_record.python import array_record_module

  shard_paths = local_shards(directory, m, list(range(len(m.shards))), cache_dir)
  names, docs = [], []
  for shard, path in zip(m.shards, shard_paths):
    decode = _Decode((shard.name,), (0, shard.documents), m.dtype, m.vocab_size, m.eod_id)
    reader = array_record_module.ArrayRecordReader(path)
    try:
      for i, record in enumerate(reader.read_all()):
        names.append(f"{shard.name}#{i}")
        docs.append(decode(i, record)["tokens"])
    finally:
      reader.close()
  return names, docs
