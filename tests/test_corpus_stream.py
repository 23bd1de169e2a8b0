"""Streaming a prepared corpus (diloco/data/corpus/stream.py): readers read only their shards,
documents are packed with the end-of-document id, segment ids and positions, the loss mask drops
the targets across a join, a reader resumes from its state, and bad records are named."""

import hashlib
import os

import numpy as np
import pytest
from array_record.python import array_record_module

from diloco import paths
from diloco.data.corpus import manifest as manifest_lib, stream
from object_store import bucket  # noqa: F401 (a fixture)

EOD = 0


def _corpus(directory, shards_docs, vocab=100):
  """Writes shards of the given documents (lists of ids) and a manifest for them."""
  os.makedirs(directory, exist_ok=True)
  dtype = manifest_lib.dtype_for(vocab)
  shards = []
  for i, docs in enumerate(shards_docs):
    name = manifest_lib.shard_name(i, len(shards_docs))
    path = os.path.join(directory, name)
    w = array_record_module.ArrayRecordWriter(path, manifest_lib.ARRAY_RECORD_OPTIONS)
    for d in docs:
      w.write(np.asarray(d, dtype).tobytes())
    w.close()
    with open(path, "rb") as f:
      sha = hashlib.file_digest(f, "sha256").hexdigest()
    ids = [x for d in docs for x in d]
    shards.append(
        manifest_lib.Shard(
            name, len(docs), len(ids), os.path.getsize(path), sha, int(max(ids, default=-1))
        )
    )
  m = manifest_lib.Manifest({"kind": "hand"}, vocab, EOD, dtype, tuple(shards), {})
  manifest_lib.write(str(directory), m)
  return m


def test_shards_are_dealt_round_robin_and_each_reader_needs_one():
  assert stream.assign(5, 2) == [[0, 2, 4], [1, 3]]
  assert stream.assign(4, 4) == [[0], [1], [2], [3]]
  with pytest.raises(ValueError, match="3 shards cannot give each of 4 readers.*--shards=4"):
    stream.assign(3, 4)


def _stream(directory, m, indices, **kw):
  paths = stream.local_shards(str(directory), m, indices, str(directory / "cache"))
  kw = {"seed": 0, "seq_len": 4, "batch_size": 2} | kw
  return stream.dataset(paths, [m.shards[i] for i in indices], m, **kw)


def test_documents_are_packed_with_their_end_segment_ids_positions_and_mask(tmp_path):
  # Three documents of 3, 2 and 4 ids: with the end-of-document id 0 after each, one epoch is
  # 12 tokens, split into sequences of 5 (4 inputs + the last target), the next epoch after.
  docs = [[11, 12, 13], [21, 22], [31, 32, 33, 34]]
  m = _corpus(tmp_path, [docs])
  it = iter(_stream(tmp_path, m, [0], batch_size=1))
  rows = [next(it) for _ in range(12)]  # 12 sequences of 5 = 5 epochs
  flat = np.concatenate([np.append(r["inputs_BxL"][0], r["targets_BxL"][0, -1]) for r in rows])
  # Each epoch holds every document once, followed by 0, in its own order.
  epochs = np.split(flat, 5)
  seen = [
      sorted(tuple(d) for d in np.split(e, np.flatnonzero(e == EOD) + 1) if len(d)) for e in epochs
  ]
  assert all(s == sorted(tuple(d) + (EOD,) for d in docs) for s in seen)
  assert len({tuple(e) for e in epochs}) > 1  # a new order in some epoch
  for r in rows:
    inputs, targets = r["inputs_BxL"][0], r["targets_BxL"][0]
    seg, pos, mask = r["segment_ids_BxL"][0], r["positions_BxL"][0], r["targets_mask_BxL"][0]
    assert (inputs[1:] == targets[:-1]).all()
    # The segment changes right after an end-of-document id, and only there; positions restart.
    for t in range(1, 4):
      assert (seg[t] != seg[t - 1]) == (inputs[t - 1] == EOD), r
      assert (pos[t] == 0) == (seg[t] != seg[t - 1]), r
    # No target is taken across a join: the end-of-document id predicts nothing.
    assert ((mask == 0) == (inputs == EOD)).all(), r


def test_a_reader_reads_only_its_shards(tmp_path):
  shards = [[[10 * s + 1, 10 * s + 2]] * 3 for s in range(4)]  # shard s holds ids 10s+1, 10s+2
  m = _corpus(tmp_path, shards)
  for r, mine in enumerate(stream.assign(4, 2)):
    it = iter(_stream(tmp_path, m, mine))
    ids = {int(x) for _ in range(10) for x in next(it)["inputs_BxL"].ravel()} - {EOD}
    assert ids == {10 * s + k for s in mine for k in (1, 2)}, (r, ids)


def test_a_reader_resumes_from_its_state(tmp_path):
  rng = np.random.default_rng(0)
  m = _corpus(tmp_path, [[list(rng.integers(1, 100, rng.integers(1, 9))) for _ in range(40)]])
  it = iter(_stream(tmp_path, m, [0], seq_len=8, batch_size=3))
  for _ in range(5):
    next(it)
  state = it.get_state()
  want = [next(it) for _ in range(4)]
  again = iter(_stream(tmp_path, m, [0], seq_len=8, batch_size=3))
  again.set_state(state)
  for a, b in zip(want, (next(again) for _ in range(4))):
    assert all((a[k] == b[k]).all() for k in a)


def test_an_id_outside_the_vocabulary_names_its_shard_and_record(tmp_path):
  m = _corpus(tmp_path, [[[1, 2], [3]], [[4], [5, 99], [6]]])
  it = iter(_stream(tmp_path, m, [1], vocab_size=50))
  with pytest.raises(
      ValueError, match=r"shard-00001-of-00002.array_record record 1: token id 99 \(vocabulary 50\)"
  ):
    for _ in range(4):
      next(it)


def test_a_reader_of_a_bucket_copies_only_its_shards_and_checks_them(tmp_path, bucket):
  local = tmp_path / "made"
  m = _corpus(local, [[[1, 2, 3]], [[4, 5]], [[6]]])
  for name in os.listdir(local):
    paths.write_bytes(f"{bucket}/c/{name}", (local / name).read_bytes())
  cache = tmp_path / "cache"
  got = stream.local_shards(f"{bucket}/c", manifest_lib.read(f"{bucket}/c"), [0, 2], str(cache))
  assert sorted(os.listdir(cache / "shards")) == sorted(os.path.basename(p) for p in got)
  assert len(got) == 2 and [os.path.getsize(p) for p in got] == [
      m.shards[0].bytes,
      m.shards[2].bytes,
  ]
  paths.write_bytes(f"{bucket}/c/{m.shards[1].name}", b"x" * m.shards[1].bytes)  # replaced
  with pytest.raises(ValueError, match=f"{m.shards[1].name}: sha256 .*, the manifest says"):
    stream.local_shards(f"{bucket}/c", m, [1], str(cache))


def test_the_loss_of_a_packed_batch_takes_no_target_across_a_join(tmp_path):
  """The stream's batch trains a tiny model: its loss is the mean over the kept targets only, so
  the target after an end-of-document id (the next document's first token) changes nothing."""
  import jax.numpy as jnp
  from flax import nnx

  from diloco.config import variants
  from diloco.models import transformer as tr

  m = _corpus(tmp_path, [[[5, 6, 7], [8, 9], [10, 11, 12, 13]]])
  batch = {k: jnp.asarray(v) for k, v in next(iter(_stream(tmp_path, m, [0], seq_len=8))).items()}
  mask = batch["targets_mask_BxL"]
  assert 0 < int(mask.sum()) < mask.size  # (a join inside)
  model = tr.Transformer(
      tr.ModelConfig(**{**variants.MODEL_SIZES["tiny"], "vocab_size": 100}), nnx.Rngs(0)
  )
  loss, _ = model.objective(batch)
  logits = model(batch["inputs_BxL"], batch["segment_ids_BxL"], batch["positions_BxL"])
  nll = tr.token_nll(logits, batch["targets_BxL"])
  assert abs(float(loss) - float((nll * mask).sum() / mask.sum())) < 1e-5
  moved = dict(batch, targets_BxL=jnp.where(mask == 0, 99, batch["targets_BxL"]))
  assert abs(float(model.objective(moved)[0]) - float(loss)) < 1e-6
  assert (
      abs(
          float(model.objective(dict(batch, targets_mask_BxL=jnp.ones_like(mask)))[0]) - float(loss)
      )
      > 1e-4
  )


def test_an_empty_shard_is_refused_naming_it(tmp_path):
  m = _corpus(tmp_path, [[[1, 2]], []])
  with pytest.raises(
      ValueError, match="shard-00001-of-00002.array_record: shard holds no documents"
  ):
    manifest_lib.check(str(tmp_path), m)
