"""Prepares a corpus: raw documents in (text, JSON Lines, Parquet), ArrayRecord shards of token ids
out, with their manifest (diloco/data/corpus/manifest.py). `python -m experiments.prepare` runs it.

- The inputs are cut into pieces (documents.py) and the pieces dealt to shards balanced by size
  (`shards.balanced_assignment`), so the plan depends only on the files, the format and the shard
  count. It is written first (OUTPUT/plan.json) and a resumed preparation must find the same one.
- Workers (processes) each write whole shards: to a local temporary file, then moved to OUTPUT
  (a rename, or one upload to a bucket), then a marker `<shard>.done` with its counts and sha256.
  A shard without its marker is written again; one with it is skipped.
- The manifest is written last: a preparation killed half way leaves none, and training refuses a
  directory without one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np
import tqdm
from array_record.python import array_record_module

from diloco.data import shards as shards_lib
from diloco import errors, paths
from diloco.data.corpus import documents, manifest as manifest_lib, tokenizer_files

PLAN = "plan.json"
PIECES_PER_SHARD = 4  # pieces are cut this much finer than shards, to balance them
BATCH = 256  # documents tokenized at a time


@dataclasses.dataclass(frozen=True)
class Spec:
  """What to prepare: every field but `workers` is part of the plan a resume must match."""

  inputs: tuple[str, ...]
  fmt: str
  tokenizer: str
  output: str
  shards: int
  field: str = "text"
  eod_token: str | None = None


def plan(spec: Spec) -> list[list[documents.Piece]]:
  """The pieces of each shard."""
  if spec.shards < 1:
    raise errors.InputError(f"shards must be >= 1, got {spec.shards}")
  found_paths = documents.list_inputs(spec.inputs)
  target = max(1, sum(found_paths.values()) // (spec.shards * PIECES_PER_SHARD))
  pieces = documents.pieces(found_paths, spec.fmt, target)
  if len(pieces) < spec.shards:
    raise errors.InputError(
        f"the inputs make {len(pieces)} pieces ({len(found_paths)} files of {spec.fmt}), too few for "
        f"{spec.shards} shards: ask for at most {len(pieces)}"
    )
  groups = shards_lib.balanced_assignment([p.size for p in pieces], spec.shards)
  return [[pieces[i] for i in g] for g in groups]


def _plan_record(spec: Spec, tok: tokenizer_files.PretrainedTokenizer, groups) -> dict:
  return {
      "inputs": list(spec.inputs),
      "format": spec.fmt,
      "field": spec.field,
      "tokenizer_sha256": tok.sha256,
      "eod_id": tok.eod_id,
      "shards": [[dataclasses.asdict(p) for p in g] for g in groups],
  }


def _claim(spec: Spec, record: dict) -> None:
  """Writes the plan, or checks the one there against it.

  The same plan: a resume. Another plan with no shard finished yet (a preparation that failed
  before writing any: a bad line fixed, another shard count): replaced. The same arguments
  over inputs that changed since (a bad line fixed after some shards were written): the
  shards whose pieces changed are written again, the others kept. Anything else is refused."""
  path = paths.join(spec.output, PLAN)
  if paths.exists(paths.join(spec.output, manifest_lib.NAME)) and not paths.exists(path):
    raise errors.InputError(
        f"{spec.output} holds a corpus this command did not prepare; use another"
    )
  if paths.exists(path):
    have = json.loads(paths.read_bytes(path))
    differ = [k for k in record if have.get(k) != record[k]]
    if not differ:
      return
    old = have.get("shards", [])
    done = [i for i in range(len(old)) if paths.exists(_marker(spec.output, i, len(old)))]
    if done and (differ != ["shards"] or len(old) != len(record["shards"])):
      raise errors.InputError(
          f"{path}: {spec.output} holds a preparation of something else (its "
          f"{', '.join(differ)} differ, {len(done)} of its {len(old)} shards written); resume it "
          "with the same arguments, or prepare into a new directory"
      )
    stale = [i for i in done if old[i] != record["shards"][i]]
    for i in stale:
      paths.remove(_marker(spec.output, i, len(old)))
    print(
        f"{spec.output}: the plan there differs (its {', '.join(differ)}): "
        + (f"{len(stale)} of {len(done)} written shards are written again" if done else "replaced"),
        file=sys.stderr,
        flush=True,
    )
  paths.write_bytes(path, json.dumps(record, indent=1).encode())


def _marker(output: str, index: int, count: int) -> str:
  """A written shard's marker (`_done`)."""
  return paths.join(output, manifest_lib.shard_name(index, count) + ".done")


def prepare(spec: Spec, workers: int = 1, progress: bool = True) -> manifest_lib.Manifest:
  """Prepares (or resumes preparing) `spec.output`; returns its manifest."""
  paths.require_bucket(spec.output, f"--output={spec.output}")
  tok = tokenizer_files.load(spec.tokenizer, spec.eod_token)
  groups = plan(spec)
  existed = paths.isdir(spec.output)
  _claim(spec, _plan_record(spec, tok, groups))
  n = len(groups)
  shards: list[manifest_lib.Shard | None] = [_done(spec.output, i, n) for i in range(n)]
  todo = [i for i in range(n) if shards[i] is None]
  bar = tqdm.tqdm(total=n, initial=n - len(todo), unit="shard", disable=not progress)
  jobs = [(spec, i, n, groups[i]) for i in todo]
  try:
    with bar, _pool(workers) as pool:
      for i, shard in zip(todo, pool.map(_write_shard, jobs) if pool else map(_write_shard, jobs)):
        shards[i] = shard
        bar.update(1)
        bar.set_postfix(tokens=sum(s.tokens for s in shards if s))
  except BaseException:
    if not any(paths.exists(_marker(spec.output, i, n)) for i in range(n)):
      paths.remove(paths.join(spec.output, PLAN))  # it wrote nothing: as if never run
      if not existed and not paths.listdir(spec.output):
        paths.rmtree(spec.output)
    raise
  m = manifest_lib.Manifest(
      tok.describe(),
      tok.vocab_size,
      tok.eod_id,
      manifest_lib.dtype_for(tok.vocab_size),
      tuple(shards),
      {"inputs": list(spec.inputs), "format": spec.fmt, "field": spec.field},
  )
  manifest_lib.write(spec.output, m)
  lost = sum(s.whitespace_lost for s in m.shards)
  if lost:
    print(
        f"{spec.output}: the tokenizer {spec.tokenizer} turns newlines, tabs and carriage returns "
        f"into spaces: {lost:,} characters of the inputs changed (code and other text whose "
        "whitespace matters reads differently; a byte-level BPE keeps them)",
        file=sys.stderr,
        flush=True,
    )
  return m


def _pool(workers: int):
  if workers <= 1:
    return _NoPool()
  # spawn: the parent may hold JAX's threads, which a fork would copy in a broken state
  context = multiprocessing.get_context("spawn")
  return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)


class _NoPool:

  def __enter__(self):
    return None

  def __exit__(self, *exc):
    return False


def _done(output: str, index: int, count: int) -> manifest_lib.Shard | None:
  """The shard's record if it was written whole (its marker there, its size as recorded)."""
  name = manifest_lib.shard_name(index, count)
  marker = _marker(output, index, count)
  if not paths.exists(marker):
    return None
  shard = manifest_lib.Shard(**json.loads(paths.read_bytes(marker)))
  path = paths.join(output, name)
  return shard if paths.exists(path) and paths.size(path) == shard.bytes else None


_TOKENIZER: dict[tuple, tokenizer_files.PretrainedTokenizer] = {}  # one load per worker process


def _write_shard(job) -> manifest_lib.Shard:
  spec, index, count, pieces = job
  key = (spec.tokenizer, spec.eod_token)
  if key not in _TOKENIZER:
    _TOKENIZER[key] = tokenizer_files.load(*key)
  tok = _TOKENIZER[key]
  dtype = np.dtype(manifest_lib.dtype_for(tok.vocab_size))
  name = manifest_lib.shard_name(index, count)
  fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp")
  os.close(fd)
  writer = array_record_module.ArrayRecordWriter(tmp, manifest_lib.ARRAY_RECORD_OPTIONS)
  docs = tokens = text_bytes = lost = 0
  max_id = -1
  try:
    for ids, nbytes, whitespace in _token_docs(tok, pieces, spec):
      writer.write(ids.astype(dtype).tobytes())
      docs, tokens, max_id = docs + 1, tokens + len(ids), max(max_id, int(ids.max()))
      text_bytes, lost = text_bytes + nbytes, lost + whitespace
  except BaseException:
    writer.close()
    os.remove(tmp)
    raise
  writer.close()
  if docs == 0:
    os.remove(tmp)
    raise errors.InputError(
        f"shard {name} got no documents from {pieces[0].path} and the rest: fewer shards"
    )
  with open(tmp, "rb") as f:
    sha = hashlib.file_digest(f, "sha256").hexdigest()
  shard = manifest_lib.Shard(
      name, docs, tokens, os.path.getsize(tmp), sha, max_id, text_bytes, lost if _lossy(tok) else 0
  )
  paths.put_file(tmp, paths.join(spec.output, name))
  paths.write_bytes(
      paths.join(spec.output, name + ".done"), json.dumps(dataclasses.asdict(shard)).encode()
  )
  return shard


def _token_docs(tok, pieces: Sequence[documents.Piece], spec: Spec) -> Iterator[tuple]:
  """(token ids, UTF-8 bytes) of every non-empty document of the pieces, in order."""
  batch: list[str] = []
  for piece in pieces:
    for _, text in documents.read(piece, spec.fmt, spec.field):
      batch.append(text)
      if len(batch) == BATCH:
        yield from _encoded(tok, batch)
        batch = []
  yield from _encoded(tok, batch)


def _encoded(tok, texts: list[str]) -> Iterator[tuple]:
  """(ids, UTF-8 bytes, newlines and tabs) of each non-empty document."""
  for ids, text in zip(tok.encode_batch(texts) if texts else [], texts):
    if len(ids):
      yield ids, len(text.encode("utf-8")), sum(text.count(c) for c in WHITESPACE)


WHITESPACE = "\n\t\r"  # what SentencePiece's default normalisation turns into spaces


def _lossy(tok) -> bool:
  """Whether the tokenizer loses newlines or tabs (SentencePiece's default normalisation)."""
  probe = "a\nb\tc\r\nd"
  return tok.decode(tok.encode(probe)) != probe


def sample_texts(inputs: Sequence[str], fmt: str, field: str, max_bytes: int) -> Iterator[str]:
  """Documents for training a tokenizer: taken in turn from every file's pieces until
  `max_bytes` of text, so a sample of a large corpus is spread over its files."""
  found_paths = documents.list_inputs(inputs)
  pieces = documents.pieces(found_paths, fmt, max(1, max_bytes // max(1, 4 * len(found_paths))))
  readers = [documents.read(p, fmt, field) for p in pieces]
  seen = 0
  while readers and seen < max_bytes:
    for reader in list(readers):
      doc = next(reader, None)
      if doc is None:
        readers.remove(reader)
        continue
      seen += len(doc[1])
      yield doc[1]
      if seen >= max_bytes:
        return
