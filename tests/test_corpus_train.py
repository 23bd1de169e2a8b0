"""Training on a prepared corpus (`data.source=corpus`): each learner's process reads only its
shards, batches pack documents (the model sees segment ids, positions and the loss mask), the
validation corpus is scored with the same masks, and a run stopped and resumed ends with the
uninterrupted run's parameters."""

import json
import os
import pathlib
import shutil
import types

import numpy as np
import pytest

from configs import shakespeare
from diloco import errors, train
from diloco.config import bounds, checks
from diloco.runners import finished_run
from diloco.data import pipeline
from diloco.data.corpus import prepare, splits as corpus_splits, tokenizer_files

WORDS = "the of and to in a is that for it as was with be by on not he this are".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A train corpus of 4 shards and a validation corpus of 1, byte-level BPE of 300 ids."""
  d = tmp_path_factory.mktemp("corpus")
  rng = np.random.default_rng(0)
  texts = [" ".join(rng.choice(WORDS, rng.integers(20, 120))) for _ in range(400)]
  for name, part in (("train", texts[:360]), ("val", texts[360:])):
    with open(d / f"{name}.jsonl", "w") as f:
      f.writelines(json.dumps({"text": t}) + "\n" for t in part)
  tok = tokenizer_files.train("bpe", texts, 300, str(d / "tokenizer.json"))
  for name, shards in (("train", 4), ("val", 1)):
    spec = prepare.Spec((str(d / f"{name}.jsonl"),), "jsonl", tok.path, str(d / name), shards)
    prepare.prepare(spec, progress=False)
  return d


def _config(corpus, variant="runlocal,mode=dp", **more):
  c = shakespeare.get_config(variant)
  c.progress_bar = False
  c.data.source, c.data.corpus, c.data.val_corpus = (
      "corpus",
      str(corpus / "train"),
      str(corpus / "val"),
  )
  c.data.cache_dir = str(corpus / "cache")
  c.update_from_flattened_dict(more)
  return c


def test_each_learners_process_reads_only_its_shards(corpus):
  cfg = _config(corpus).data
  splits = pipeline.load_splits(cfg)
  names = [s.name for s in splits.train[0].manifest.shards]
  where = dict(seed=0, global_batch_size=4, seq_len=16)
  for learner, process, want in ((0, 0, [0, 2]), (1, 0, [1, 3])):
    d = pipeline.make_datasets(splits, cfg, **where, shard_index=learner, num_shards=2,
                               process_index=process, process_count=1)  # fmt: skip
    assert d.shard_plays == tuple(names[i] for i in want) and d.packed
  d = pipeline.make_datasets(splits, cfg, **where, shard_index=1, num_shards=2, process_index=1,
                             process_count=2)  # fmt: skip
  assert d.shard_plays == (names[3],)
  batch = next(d.train_iter)
  assert batch["inputs_BxL"].shape == (2, 16) and set(batch) >= {
      "segment_ids_BxL",
      "targets_mask_BxL",
  }
  with pytest.raises(ValueError, match="4 shards cannot give each of 6 readers"):
    pipeline.make_datasets(splits, cfg, **where, shard_index=0, num_shards=3, process_index=0,
                           process_count=2)  # fmt: skip


def test_a_run_on_the_corpus_trains_and_resumes_to_the_same_parameters(corpus, tmp_path):
  config = _config(corpus, steps=12, checkpoint_every=6)
  workdir = str(tmp_path / "run")
  whole = train.train_and_evaluate(config, workdir)
  assert whole["data"]["source"] == "corpus" and whole["data"]["train_shards"] == 4
  assert np.isfinite(whole["eval_loss"]) and whole["eval_loss"] < np.log(300)
  # As if stopped after step 6: its checkpoint holds the reader's position in the corpus.
  shutil.rmtree(os.path.join(workdir, "checkpoints", "12"))
  resumed = train.train_and_evaluate(config, workdir)
  assert resumed["resumed_from_step"] == 6
  assert resumed["params_sha256"] == whole["params_sha256"]
  # The finished run is scored and sampled through the corpus's own tokenizer (before: the corpus
  # splits had no tokenizer, and both commands failed with an AttributeError).
  run = finished_run.open_run(workdir)
  assert finished_run.evaluate(run)["eval_loss"] == pytest.approx(resumed["eval_loss"], rel=1e-5)
  (tmp_path / "t.txt").write_text(" ".join(WORDS * 3))  # 60 words: over 33 ids, under 65
  text = finished_run.evaluate(run, str(tmp_path / "t.txt"))
  assert text["sequences"] == 1 and text["eval_loss"] < np.log(300)
  ids, sampled = finished_run.sample(run, "the of", 8, temperature=0.0, top_k=0, seed=0)
  assert len(ids) == 8 and sampled == run.tokenizer.decode(ids).decode("utf-8", errors="replace")
  assert run.tokenizer.decode(run.tokenizer.encode(b"the naive and")) == b"the naive and"


def test_a_vocabulary_given_that_is_not_the_corpus_s_is_refused_naming_both(corpus, tmp_path):
  """Before: model.vocab_size=4096 was replaced by the corpus's 300 without a word."""
  workdir = tmp_path / "run"
  with pytest.raises(checks.ConfigError, match=r"model.vocab_size=4096: 4,096 given, but the "
                     r"corpus .*train has 300 ids"):  # fmt: skip
    train.train_and_evaluate(_config(corpus, **{"model.vocab_size": 4096}), str(workdir))
  assert not (workdir / "config.json").exists()


def test_the_logits_bound_counts_the_corpus_vocabulary_not_bytes():
  """Before: the memory bound of a corpus run counted a vocabulary of 256 (the byte tokenizer's
  setting), whatever the corpus had. Logits are 4 x batch x seq_len x vocabulary bytes: with a
  limit of 1,000 ids' worth the byte count passes, and the data's 300 ids pass while 4,096 do
  not, naming the batch key."""
  c = checks.prepare(_config(pathlib.Path("/nowhere")))
  batch, seq = max(c.batch_size, c.data.eval_batch_size), c.seq_len
  limit = (4.0 * batch * seq * 1000, "a test's 1,000 ids")
  assert bounds.problems(c, limit) == []
  data = lambda vocab: types.SimpleNamespace(vocab_size=vocab, manifest=None, train=None)
  assert bounds.data_problems(c, data(300), limit) == []
  [(key, why)] = bounds.data_problems(c, data(4096), limit)
  assert key in ("batch_size", "data.eval_batch_size") and "vocabulary 4,096" in why


def test_a_warm_start_that_does_not_fit_leaves_the_workdir_free(corpus, tmp_path):
  """Before: config.json stayed, and the corrected command was refused (init_from: ... -> "")."""
  first = str(tmp_path / "first")
  train.train_and_evaluate(_config(corpus, steps=2), first)
  workdir = tmp_path / "run"
  config = _config(corpus, steps=2, init_from=first, **{"model.d_model": 48})
  with pytest.raises(errors.InputError, match=r"init_from=.*first.*does not fit this run's model"):
    train.train_and_evaluate(config, str(workdir))
  assert not (workdir / "config.json").exists()
  config.init_from = ""
  assert train.train_and_evaluate(config, str(workdir))["finished"]


def test_a_corpus_that_is_not_there_is_named_before_the_workdir_is_touched(corpus, tmp_path):
  config = _config(corpus)
  config.data.corpus = str(tmp_path / "nothing")
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"nothing/manifest.json does not exist.*did not finish"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()
  config = _config(corpus)
  config.data.val_corpus = ""
  with pytest.raises(Exception, match="data.val_corpus"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_decoupled_learners_train_on_their_own_shards_and_resume_their_readers(corpus, tmp_path):
  config = _config(corpus, "runlocal,mode=decoupled", steps=16)
  s = train.train_and_evaluate(config, str(tmp_path / "whole"))
  assert s["data"]["train_shards"] == 4 and np.isfinite(s["eval_loss"])
  assert [r["merged_share"] > 0 for r in s["per_learner"]] == [True, True]
  # Stopped after 7 steps and resumed from the run's snapshot, which holds both learners'
  # reader positions (and counts): the same parameters, and the same tokens read.
  config.stop_after_steps = 7
  part = train.train_and_evaluate(config, str(tmp_path / "split"))
  assert part["stopped_by"] == "stop_after_steps"
  config.stop_after_steps = 0
  rest = train.train_and_evaluate(config, str(tmp_path / "split"))
  assert rest["params_sha256"] == s["params_sha256"]
  assert rest["data"]["mixture"] == s["data"]["mixture"]


def _other(corpus, name, tokenizer):
  """A second corpus of other words (2 shards), prepared with `tokenizer`."""
  rng = np.random.default_rng(1)
  words = "one two three four five six seven eight nine ten".split()
  texts = [" ".join(rng.choice(words, rng.integers(20, 120))) for _ in range(120)]
  with open(corpus / f"{name}.jsonl", "w") as f:
    f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
  spec = prepare.Spec((str(corpus / f"{name}.jsonl"),), "jsonl", tokenizer, str(corpus / name), 2)
  prepare.prepare(spec, progress=False)
  return str(corpus / name)


def test_a_mixture_trains_on_each_corpus_by_its_weight_and_records_it(corpus, tmp_path):
  other = _other(corpus, "other", str(corpus / "tokenizer.json"))
  config = _config(corpus, steps=12, **{"data.corpus_weights": "1,3"})
  config.data.corpus = f"{corpus / 'train'},{other}"
  s = train.train_and_evaluate(config, str(tmp_path / "run"))
  got = s["data"]["mixture"]
  assert [g["corpus"] for g in got] == [str(corpus / "train"), other]
  assert [g["weight"] for g in got] == [0.25, 0.75]
  # Every input token of the 12 steps counted once, about a quarter from the first corpus.
  assert sum(g["tokens"] for g in got) == 12 * config.batch_size * config.seq_len
  assert got[0]["share"] == pytest.approx(0.25, abs=0.06)
  assert s["data"]["train_shards"] == 6 and np.isfinite(s["eval_loss"])


def test_a_mixture_of_two_tokenizers_or_the_wrong_weights_is_refused(corpus, tmp_path):
  tok = tokenizer_files.train("bpe", ["other words entirely"] * 50, 280, str(tmp_path / "t.json"))
  odd = _other(tmp_path, "odd", tok.path)
  workdir = tmp_path / "run"
  config = _config(corpus)
  config.data.corpus = f"{corpus / 'train'},{odd}"
  with pytest.raises(ValueError, match=r"tokenizer .*train.*is not the one .*odd/manifest.json"):
    train.train_and_evaluate(config, str(workdir))
  config = _config(corpus, **{"data.corpus_weights": "1"})
  config.data.corpus = f"{corpus / 'train'},{corpus / 'train'}x"
  with pytest.raises(ValueError, match="manifest.json does not exist"):
    train.train_and_evaluate(config, str(workdir))
  config.data.corpus = (
      f"{corpus / 'train'},{_other(corpus, 'other2', str(corpus / 'tokenizer.json'))}"
  )
  with pytest.raises(ValueError, match=r"corpus_weights='1' gives 1 weights for 2 corpora"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_a_corrupt_shard_of_the_same_size_is_named_before_the_workdir_is_touched(corpus, tmp_path):
  copy = tmp_path / "train"
  shutil.copytree(corpus / "train", copy)
  config = _config(corpus, "runlocal,mode=decoupled")
  config.data.corpus = str(copy)
  # Checked once (learner 1 of 2 reads shards 1 and 3), then one byte of shard 1 changes.
  corpus_splits.fetch_own(config.data, [0, 1], 2, 0, 1)
  shard = copy / "shard-00001-of-00004.array_record"
  data = bytearray(shard.read_bytes())
  data[len(data) // 2] ^= 0xFF
  shard.write_bytes(bytes(data))
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"shard-00001-of-00004.array_record: sha256 \w+, the "):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()
