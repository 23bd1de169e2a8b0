"""Preparing a corpus (diloco/data/corpus): documents of text, JSON Lines and Parquet in, token
shards and a manifest out; tokenizers trained once or loaded from a file; a resumed preparation
redoes only what a kill left unfinished; bad input is refused naming the file."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from array_record.python import array_record_module

from diloco import paths
from diloco.data.corpus import documents, manifest as manifest_lib, prepare, tokenizer_files
from object_store import bucket  # noqa: F401 (a fixture)

WORDS = "the of and to in a is that for it as was with be by on not he this are".split()


def _texts(n, seed=0):
  """n documents of 5 to 60 random words (some with a newline, some with unicode)."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    words = rng.choice(WORDS + ["naïve", "Zürich", "\u00e9t\u00e9"], rng.integers(5, 60))
    out.append(" ".join(words) + ("\nend" if i % 7 == 0 else ""))
  return out


def _jsonl(tmp_path, texts, files=3):
  paths = []
  for f in range(files):
    p = tmp_path / f"part{f}.jsonl"
    with open(p, "w", encoding="utf-8") as out:
      for i in range(f, len(texts), files):
        out.write(json.dumps({"id": i, "text": texts[i]}) + "\n")
    paths.append(p)
  return paths


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
  d = tmp_path_factory.mktemp("tok")
  return tokenizer_files.train("bpe", _texts(400, seed=1), 400, str(d / "tokenizer.json"))


def _read_shards(directory, m):
  dtype = np.dtype(m.dtype)
  docs = []
  for s in m.shards:
    reader = array_record_module.ArrayRecordReader(os.path.join(directory, s.name))
    docs += [np.frombuffer(r, dtype) for r in reader.read_all()]
    reader.close()
  return docs


def test_a_jsonl_corpus_becomes_shards_that_hold_every_document_once(tmp_path, bpe):
  texts = _texts(300)
  _jsonl(tmp_path, texts)
  spec = prepare.Spec((str(tmp_path / "*.jsonl"),), "jsonl", bpe.path, str(tmp_path / "out"), 4)
  m = prepare.prepare(spec, progress=False)
  assert m.documents == 300 and len(m.shards) == 4 and all(s.documents > 0 for s in m.shards)
  assert (m.vocab_size, m.dtype) == (bpe.vocab_size, "<u2") and m.eod_id == bpe.eod_id
  docs = _read_shards(spec.output, m)
  # Byte-level BPE is lossless: each record decodes to one input document, each exactly once.
  assert sorted(bpe.decode(d) for d in docs) == sorted(texts)
  assert m.tokens == sum(len(d) for d in docs) == sum(len(bpe.encode(t)) for t in texts)
  assert sum(s.text_bytes for s in m.shards) == sum(len(t.encode()) for t in texts)
  assert max(int(d.max()) for d in docs) == max(s.max_id for s in m.shards) < m.vocab_size
  assert manifest_lib.read(spec.output) == m
  manifest_lib.check(spec.output, m, vocab_size=bpe.vocab_size)


@pytest.mark.parametrize("target", [1, 7, 50, 333, 10**6])
def test_json_lines_pieces_hold_each_line_once_wherever_the_cuts_fall(tmp_path, target):
  texts = _texts(40)
  (path,) = _jsonl(tmp_path, texts, files=1)
  pieces = documents.pieces(documents.list_inputs([str(path)]), "jsonl", target)
  got = [t for p in pieces for _, t in documents.read(p, "jsonl")]
  assert got == texts and pieces[-1].end == os.path.getsize(path)


def test_parquet_and_text_inputs(tmp_path, bpe):
  pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
  texts = _texts(60)
  pq.write_table(pa.table({"body": texts}), tmp_path / "a.parquet", row_group_size=10)
  found = documents.list_inputs([str(tmp_path / "a.parquet")])
  meta = pq.ParquetFile(tmp_path / "a.parquet").metadata
  group_bytes = max(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
  whole = documents.pieces(found, "parquet", group_bytes)
  bounds = [(p.start, p.end) for p in whole]  # whole row groups, together up to the target
  assert [b for b, _ in bounds[1:]] == [e for _, e in bounds[:-1]] and bounds[-1][1] == 60
  assert bounds[0][0] == 0 and all(b % 10 == 0 for bound in bounds for b in bound)
  pieces = documents.pieces(found, "parquet", 1)
  assert len(pieces) == 60  # at a target of one byte, a row each
  assert [t for p in pieces for _, t in documents.read(p, "parquet", "body")] == texts
  # One row group of 60 rows still makes four pieces of 15 rows at a quarter of its bytes.
  pq.write_table(pa.table({"body": texts}), tmp_path / "one.parquet", row_group_size=60)
  found = documents.list_inputs([str(tmp_path / "one.parquet")])
  one_bytes = pq.ParquetFile(tmp_path / "one.parquet").metadata.row_group(0).total_byte_size
  quarters = documents.pieces(found, "parquet", math.ceil(one_bytes / 4))
  assert [(p.start, p.end) for p in quarters] == [(0, 15), (15, 30), (30, 45), (45, 60)]
  assert [t for p in quarters for _, t in documents.read(p, "parquet", "body")] == texts
  names = [
      n
      for _, n in zip(
          range(12), (n for p in pieces for n, _ in documents.read(p, "parquet", "body"))
      )
  ]
  assert names[11].endswith("a.parquet#11")
  for i, t in enumerate(texts[:5]):
    (tmp_path / f"doc{i}.txt").write_text(t, encoding="utf-8")
  spec = prepare.Spec((str(tmp_path / "doc*.txt"),), "text", bpe.path, str(tmp_path / "t"), 2)
  m = prepare.prepare(spec, progress=False)
  assert sorted(bpe.decode(d) for d in _read_shards(spec.output, m)) == sorted(texts[:5])


def test_a_sentencepiece_model_trains_and_loads_with_its_end_of_document_id(tmp_path):
  tok = tokenizer_files.train("sentencepiece", _texts(300), 320, str(tmp_path / "sp.model"))
  assert tok.kind == "sentencepiece" and tok.vocab_size <= 320
  assert tok.decode(tok.encode("the naïve and")) == "the naïve and"
  assert tok.eod_id == tokenizer_files.load(str(tmp_path / "sp.model")).eod_id
  assert tok.decode([tok.eod_id]) == tokenizer_files.TRAINED_EOD  # one piece of its own


def test_a_tokenizer_that_turns_newlines_into_spaces_is_said_once_with_the_count(
    tmp_path, bpe, capsys
):
  """SentencePiece's default normalisation turns the newline of every seventh document (_texts)
  into a space: the preparation says so once, with the count; a byte-level BPE keeps it."""
  texts = _texts(70)
  _jsonl(tmp_path, texts, files=1)
  sp = tokenizer_files.train("sentencepiece", _texts(300), 320, str(tmp_path / "sp.model"))
  for tok, lost in ((sp, 10), (bpe, 0)):
    out = str(tmp_path / tok.kind)
    m = prepare.prepare(prepare.Spec((str(tmp_path / "part0.jsonl"),), "jsonl", tok.path, out, 2),
                        progress=False)  # fmt: skip
    assert (
        sum(s.whitespace_lost for s in m.shards)
        == lost
        == sum(t.count("\n") for t in texts) * (tok is sp)
    )
    said = [l for l in capsys.readouterr().err.splitlines() if "into spaces" in l]
    assert said == ([f"{out}: the tokenizer {tok.path} turns newlines, tabs and carriage returns "
                     "into spaces: 10 characters of the inputs changed (code and other text whose "
                     "whitespace matters reads differently; a byte-level BPE keeps them)"]
                    if lost else [])  # fmt: skip


def test_a_killed_preparation_leaves_no_manifest_and_a_resume_redoes_only_what_is_missing(
    tmp_path, bpe, monkeypatch
):
  _jsonl(tmp_path, _texts(200))
  spec = prepare.Spec((str(tmp_path / "*.jsonl"),), "jsonl", bpe.path, str(tmp_path / "out"), 4)
  write = prepare._write_shard
  calls = []

  def dies_at_the_third(job):
    calls.append(job[1])
    if len(calls) == 3:
      raise KeyboardInterrupt  # a kill between two shards' writes
    return write(job)

  monkeypatch.setattr(prepare, "_write_shard", dies_at_the_third)
  with pytest.raises(KeyboardInterrupt):
    prepare.prepare(spec, progress=False)
  with pytest.raises(ValueError, match="manifest.json does not exist.*did not finish"):
    manifest_lib.read(spec.output)
  calls.clear()
  monkeypatch.setattr(prepare, "_write_shard", lambda job: calls.append(job[1]) or write(job))
  m = prepare.prepare(spec, progress=False)
  assert calls == [2, 3]  # shards 0 and 1 were whole
  again = prepare.prepare(dataclasses_replace(spec, output=str(tmp_path / "fresh")), progress=False)
  assert [s.sha256 for s in again.shards] == [s.sha256 for s in m.shards]


def dataclasses_replace(spec, **kw):
  import dataclasses

  return dataclasses.replace(spec, **kw)


def test_a_resume_with_other_arguments_is_refused(tmp_path, bpe):
  _jsonl(tmp_path, _texts(100))
  spec = prepare.Spec((str(tmp_path / "*.jsonl"),), "jsonl", bpe.path, str(tmp_path / "out"), 2)
  prepare.prepare(spec, progress=False)
  with pytest.raises(ValueError, match="plan.json.*something else.*shards differ"):
    prepare.prepare(dataclasses_replace(spec, shards=3), progress=False)


@pytest.mark.parametrize(
    "line, why",
    [
        (
            "{not json",
            r"part0.jsonl@\d+: not a JSON line \(Expecting property name enclosed in "
            r"double quotes: column 2\)",
        ),
        ('{"body": "x"}', r"part0.jsonl@\d+: no string field 'text' \(keys: body\)"),
        ('{"text": 3}', r"no string field 'text'"),
    ],
)
def test_a_bad_json_line_is_refused_naming_the_file_and_offset(tmp_path, bpe, line, why):
  (path,) = _jsonl(tmp_path, _texts(10), files=1)
  with open(path, "a", encoding="utf-8") as f:
    f.write(line + "\n")
  spec = prepare.Spec((str(path),), "jsonl", bpe.path, str(tmp_path / "out"), 1)
  with pytest.raises(ValueError, match=why):
    prepare.prepare(spec, progress=False)
  assert not os.path.exists(tmp_path / "out" / manifest_lib.NAME)
  assert not list(tmp_path.glob("out/*.tmp")) and not list(tmp_path.glob("out/*.done"))
  # The line fixed, the same command prepares (the failed preparation's plan is replaced).
  with open(path, "r+", encoding="utf-8") as f:
    lines = f.readlines()[:-1] + [json.dumps({"text": "fixed"}) + "\n"]
    f.seek(0)
    f.writelines(lines)
    f.truncate()
  m = prepare.prepare(spec, progress=False)
  assert m.documents == 11


def test_a_fixed_input_after_some_shards_rewrites_only_the_shards_it_changed(
    tmp_path, bpe, monkeypatch
):
  """Two files, a piece each, the larger in shard 0: the smaller fails on a bad line after
  shard 0 was written; fixed, the same command writes shard 1 again and keeps shard 0."""
  monkeypatch.setattr(prepare, "PIECES_PER_SHARD", 1)
  a, b = _jsonl(tmp_path, _texts(40), files=2)
  with open(a, "a", encoding="utf-8") as f:
    f.writelines(json.dumps({"text": t}) + "\n" for t in _texts(20, seed=2))
  with open(b, "a", encoding="utf-8") as f:
    f.write("{not json\n")
  spec = prepare.Spec((str(a), str(b)), "jsonl", bpe.path, str(tmp_path / "out"), 2)
  with pytest.raises(ValueError, match="part1.jsonl@.*not a JSON line"):
    prepare.prepare(spec, progress=False)
  done = sorted(p.name for p in (tmp_path / "out").glob("*.done"))
  assert len(done) == 1
  first = (tmp_path / "out" / done[0]).stat().st_mtime_ns
  b.write_text(b.read_text(encoding="utf-8").replace("{not json\n", ""), encoding="utf-8")
  m = prepare.prepare(spec, progress=False)
  assert m.documents == 60 and (tmp_path / "out" / done[0]).stat().st_mtime_ns == first
  with pytest.raises(ValueError, match="shards differ, 2 of its 2 shards written"):
    prepare.prepare(dataclasses_replace(spec, shards=1), progress=False)


def test_inputs_and_tokenizers_that_do_not_exist_are_named(tmp_path, bpe):
  with pytest.raises(ValueError, match=r"input '.*nothing\*.jsonl' matches no files"):
    documents.list_inputs([str(tmp_path / "nothing*.jsonl")])
  with pytest.raises(ValueError, match=r"tokenizer '.*missing.json' does not exist"):
    tokenizer_files.load(str(tmp_path / "missing.json"))
  with pytest.raises(ValueError, match=r"has no '<eod>': name its end-of-document token"):
    tokenizer_files.load(bpe.path, eod_token="<eod>")
  (tmp_path / "bad.json").write_text("{}")
  with pytest.raises(ValueError, match="bad.json' is not a readable hf model"):
    tokenizer_files.load(str(tmp_path / "bad.json"))


def test_the_manifest_check_names_a_truncated_missing_or_foreign_shard(tmp_path, bpe):
  _jsonl(tmp_path, _texts(100))
  out = str(tmp_path / "out")
  m = prepare.prepare(
      prepare.Spec((str(tmp_path / "*.jsonl"),), "jsonl", bpe.path, out, 2), progress=False
  )
  first = os.path.join(out, m.shards[0].name)
  with pytest.raises(ValueError, match="vocabulary of .* does not fit the model's 100"):
    manifest_lib.check(out, m, vocab_size=100)
  with pytest.raises(ValueError, match="is not the one .*manifest.json was prepared with"):
    manifest_lib.check_tokenizer(out, m, "0" * 64, "other.json")
  with open(first, "r+b") as f:
    f.truncate(m.shards[0].bytes - 10)
  with pytest.raises(ValueError, match=f"{m.shards[0].name}: .* bytes, the manifest says"):
    manifest_lib.check(out, m)
  os.remove(first)
  with pytest.raises(
      ValueError, match=f"{m.shards[0].name}: shard listed in the manifest is missing"
  ):
    manifest_lib.check(out, m)


def test_the_command_trains_a_tokenizer_then_prepares_with_two_workers(tmp_path):
  _jsonl(tmp_path, _texts(200))
  run = lambda *a: subprocess.run(
      [sys.executable, "-m", "experiments.prepare", *a, f"--inputs={tmp_path}/*.jsonl"],
      capture_output=True,
      text=True,
      check=True,
      timeout=300,
  )
  tok = str(tmp_path / "tok.json")
  assert (
      "300 ids" in run("tokenizer", "--kind=bpe", "--vocab_size=300", f"--tokenizer={tok}").stdout
  )
  out = run("shards", f"--tokenizer={tok}", f"--output={tmp_path}/c", "--shards=3", "--workers=2")
  assert "3 shards, 200 documents" in out.stdout
  assert (
      manifest_lib.read(str(tmp_path / "c")).tokenizer["sha256"] == tokenizer_files.load(tok).sha256
  )


def test_inputs_tokenizer_and_shards_in_a_bucket(tmp_path, bpe, bucket):
  """Against the Cloud Storage server on the loopback (tests/object_store.py): everything read
  from and written to gs:// URLs, nothing of it on the local disk."""
  import fsspec

  texts = _texts(120)
  for path in _jsonl(tmp_path, texts, files=2):
    paths.write_bytes(f"{bucket}/raw/{path.name}", path.read_bytes())
  paths.write_bytes(f"{bucket}/tok/tokenizer.json", paths.read_bytes(bpe.path))
  out = f"{bucket}/corpus"
  spec = prepare.Spec((f"{bucket}/raw/*.jsonl",), "jsonl", f"{bucket}/tok/tokenizer.json", out, 2)
  m = prepare.prepare(spec, progress=False)
  assert m.documents == 120 and manifest_lib.read(out) == m
  manifest_lib.check(out, m, vocab_size=bpe.vocab_size)
  local = tmp_path / "copy"
  fsspec.filesystem("gs").get(f"{out[5:]}/", str(local), recursive=True)
  assert sorted(bpe.decode(d) for d in _read_shards(str(local), m)) == sorted(texts)
  with pytest.raises(ValueError, match=f"{bucket}/nothing/manifest.json does not exist"):
    manifest_lib.read(f"{bucket}/nothing")
