"""lm-evaluation-harness over our decoder (diloco/harness): its log-likelihoods are the model's own
losses, packed or not; a model that memorised a local multiple-choice task gets it all right and a
random one about chance; generation stops at the given strings; unknown tasks and bad task YAML
are refused before anything is written; the shipped Shakespeare task is rebuilt bit for bit from
the validation plays and shares no line with the training split."""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

pytest.importorskip("lm_eval")

from diloco.config import variants
from diloco.data import tokenizers
from diloco.harness import model as harness_model, shakespeare_task, tasks
from diloco.inner import sharding
from diloco.models import losses, transformer as tr
from diloco.rpc import forked

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW = 32
ANSWERS = ("red", "tan", "sky", "owl")  # one length: acc and acc_norm agree
ITEMS = 12


def _lm(params_seed: int = 0, params=None) -> harness_model.JaxLM:
  cfg = tr.ModelConfig(**{**variants.MODEL_SIZES["tiny"], "vocab_size": 256, "max_len": WINDOW})
  graphdef, state = nnx.split(tr.Transformer(cfg, nnx.Rngs(params_seed)))
  mesh = sharding.make_island_mesh(jax.devices()[:2], 2, 1, 1, 1)
  params = nnx.to_pure_dict(state) if params is None else params
  return harness_model.JaxLM(graphdef, params, tokenizers.ByteTokenizer(), WINDOW, mesh, 4)


def _nll_sum(lm, inputs: list[int], targets: list[int], scored: int) -> float:
  """The model's own cross entropy (models/losses.py) of the last `scored` targets, unpacked."""
  logits = nnx.merge(lm.graphdef, lm.params)(jnp.asarray([inputs]))
  return float(np.sum(losses.token_nll(logits, jnp.asarray([targets]))[0, -scored:]))


def test_loglikelihoods_are_the_models_own_losses_packed_and_truncated():
  lm = _lm()
  pairs = [
      (list(b"ROMEO: hi"), list(b" there")),
      (list(b"a"), list(b"bcdefghij")),
      (list(b"x" * 40), list(b"yz")),  # 42 tokens: the first 9 fall out of the 32 + 1
      (list(b"To be"), list(b", or not")),
  ]
  got = lm.score_tokens(pairs)
  # Packed: 14 + 9 + 12 tokens share rows beside the 32 of the truncated request (4 requests,
  # longest first, each into the row with the most room: [32], [14, 12], [9]).
  assert lm.stats.rows == 3 and lm.stats.tokens == 14 + 9 + 32 + 12
  for (context, continuation), (logp, _) in zip(pairs, got):
    whole = (context + continuation)[-(WINDOW + 1) :]
    want = -_nll_sum(lm, whole[:-1], whole[1:], len(continuation))
    assert logp == pytest.approx(want, abs=1e-4)


def test_rolling_loglikelihood_scores_each_token_once_in_the_harness_windows():
  lm = _lm()
  text = bytes(range(40, 110))  # 70 tokens: windows of 32, 32 and the last 6
  s = [lm.eot_token_id, *text]  # the prefix token first (a newline for the byte tokenizer)
  assert lm.eot_token_id == ord("\n")
  want = -(
      _nll_sum(lm, s[0:32], s[1:33], 32)
      + _nll_sum(lm, s[32:64], s[33:65], 32)
      + _nll_sum(lm, s[38:70], s[39:71], 6)
  )
  request = type("Request", (), {"args": (text.decode(),)})
  assert lm.loglikelihood_rolling([request]) == [pytest.approx(want, abs=1e-3)]


def _task_dir(tmp_path, labels):
  items = [
      {"context": f"item {i:02d}: ", "choices": list(ANSWERS), "label": int(k)}
      for i, k in enumerate(labels)
  ]
  d = tmp_path / "quiz"
  d.mkdir()
  (d / "quiz.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
  (d / "quiz.yaml").write_text(
      "task: quiz\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: quiz.jsonl\n"
      "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
      "doc_to_choice: '{{choices}}'\ndoc_to_target: label\ntarget_delimiter: ''\n"
      "metric_list:\n  - metric: acc\n"
  )
  return str(d), items


def _memorised(items) -> dict:
  """The tiny model's parameters after it learned each item's line by heart."""
  lm = _lm()
  lines = [(x["context"] + ANSWERS[x["label"]] + "\n").encode() for x in items]  # as scored
  batch = jnp.asarray([list(line) for line in lines])  # one length
  model = nnx.merge(lm.graphdef, lm.params)
  tx = optax.adam(1e-2)
  graphdef, params = nnx.split(model)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt):
    def loss(p):
      logits = nnx.merge(graphdef, p)(batch[:, :-1])
      return losses.cross_entropy(logits, batch[:, 1:])

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, value

  for _ in range(400):
    params, opt, value = step(params, opt)
  assert float(value) < 0.5  # (the context bytes are shared and predictable; the answers too)
  return nnx.to_pure_dict(params)


@pytest.fixture(scope="module")
def quiz(tmp_path_factory):
  labels = np.random.default_rng(0).integers(len(ANSWERS), size=ITEMS)
  path, items = _task_dir(tmp_path_factory.mktemp("tasks"), labels)
  return path, items, _memorised(items)


def test_a_model_that_memorised_a_local_task_scores_one_and_a_random_one_about_chance(quiz):
  path, _, memorised = quiz
  task_list = tasks.resolve(path)  # a local folder: its data file read relative to its YAML
  assert [t["task"] for t in task_list] == ["quiz"]
  learned = tasks.scores(tasks.run(_lm(params=memorised), task_list))["quiz"]
  assert learned["value"] == 1.0 and learned["metric"] == "acc"
  guess = tasks.scores(tasks.run(_lm(params_seed=3), task_list))["quiz"]
  # Chance is 1/4; 12 items give a standard error near 0.125 (the harness's, below).
  assert abs(guess["value"] - 0.25) <= 2 * 0.125 and guess["stderr"] == pytest.approx(
      np.sqrt(guess["value"] * (1 - guess["value"]) / (ITEMS - 1)), rel=1e-6
  )


def test_generate_until_stops_at_the_first_until_string(quiz):
  _, items, memorised = quiz
  lm = _lm(params=memorised)
  x = items[5]
  request = type("Request", (), {"args": (x["context"], {"until": ["\n"], "max_gen_toks": 20})})
  assert lm.generate_until([request]) == [ANSWERS[x["label"]]]
  assert lm.stats.generated == 4  # the answer's 3 bytes and the newline that stopped it
  request.args = (x["context"], {"until": ["e", "k"], "max_gen_toks": 20})  # inside the answer
  text = lm.generate_until([request])[0]
  assert text == ANSWERS[x["label"]].split("e")[0].split("k")[0]


def test_unknown_tasks_and_bad_yaml_are_refused_naming_them(tmp_path):
  with pytest.raises(tasks.TaskError, match="no harness task, group or local folder named 'nope'"):
    tasks.resolve(f"{shakespeare_task.TASK},nope")
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "broken.yaml").write_text("task: broken\ndoc_to_text: [unclosed\n")
  with pytest.raises(tasks.TaskError, match=r"broken\.yaml is not a task's YAML"):
    tasks.resolve(str(bad))
  (bad / "broken.yaml").write_text(
      "task: broken\ndataset_kwargs:\n  data_files:\n    test: x.jsonl\n"
  )
  with pytest.raises(tasks.TaskError, match=r"data file .*bad/x\.jsonl does not exist"):
    tasks.resolve(str(bad))


def test_the_cli_refuses_a_bad_task_folder_before_writing(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"mode": "dp"}))  # read only after the tasks
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "t.yaml").write_text("task: [\n")
  before = sorted(os.listdir(run))
  argv = ["-m", "experiments.evaluate", f"--workdir={run}", f"--tasks={bad}"]
  p = forked.run(argv, dict(os.environ), REPO, timeout=300)
  assert p.returncode == 2, p.stderr[-2000:]
  assert p.stderr.strip().splitlines()[-1].startswith(f"error: --tasks: {bad}/t.yaml")
  assert sorted(os.listdir(run)) == before


def test_the_shakespeare_task_is_rebuilt_bit_for_bit_from_the_validation_plays_only():
  from diloco.data import shakespeare

  corpus = shakespeare.ensure_prepared()
  plays = shakespeare_task.validation_plays(corpus)
  train = bytes(corpus.train_tokens).decode()
  items = shakespeare_task.build_items(plays, train)
  with open(os.path.join(shakespeare_task.TASK_DIR, shakespeare_task.ITEMS_FILE)) as f:
    shipped = [json.loads(line) for line in f]
  assert items == shipped and len(items) == 4 * shakespeare_task.ITEMS_PER_PLAY
  texts = dict(plays)
  assert set(texts) == set(shakespeare.VALIDATION_PLAYS)
  lines = {name: set(text.split("\n")) for name, text in plays}
  seen = set(train.split("\n"))
  for x in items:
    before, head = x["context"].split("\n")
    tail = x["choices"][x["label"]]
    assert f"\n{before}\n{head}{tail}\n" in texts[x["play"]]  # the line after `before`, cut
    assert head + tail in lines[x["play"]] and head + tail not in seen
    assert len(head) >= len(head + tail) // 3 and len(tail) >= len(head + tail) // 3
    # Every choice is the tail of a line of the same play that the training split does not
    # hold (a model that saw a distractor there would prefer it), all of one length.
    assert len(set(x["choices"])) == 4 and len({len(c) for c in x["choices"]}) == 1
    n = len(tail)
    assert set(x["choices"]) <= {l[-n:] for l in lines[x["play"]] - seen if len(l) > n}
  # The labels are spread over the four places (no position wins by itself).
  counts = np.bincount([x["label"] for x in items], minlength=4)
  assert counts.min() > 200


def test_a_run_scores_its_harness_tasks_at_every_nth_evaluation_and_the_final_one(quiz, tmp_path):
  from configs import shakespeare
  from diloco import metrics, train

  path, _, _ = quiz
  config = shakespeare.get_config("runlocal")
  with config.unlocked():
    config.progress_bar = False
    config.eval_every = 10  # evaluations at steps 10, 20, 30 and 40 (the final one)
    config.eval.harness_tasks, config.eval.harness_every = path, 3
  summary = train.train_and_evaluate(config, str(tmp_path))
  rows = [r for r in metrics.read_jsonl(str(tmp_path / "metrics.jsonl")) if "eval_loss" in r]
  scored = [r["step"] for r in rows if "harness/quiz/acc" in r]
  assert [r["step"] for r in rows] == [10, 20, 30, 40] and scored == [30, 40]
  assert summary["harness/quiz/acc"] == rows[-1]["harness/quiz/acc"]
  assert 0.0 <= summary["harness/quiz/acc"] <= 1.0 and summary["harness_padding"] < 0.5
  # The finished run, evaluated afterwards on two tasks (experiments.evaluate --tasks): the
  # in-training score again, the results file, a metrics row, and an average column.
  from diloco.harness import records
  from diloco.runners import finished_run

  twin = tmp_path / "quiz_twin"
  twin.mkdir()
  for name in ("quiz.jsonl", "quiz.yaml"):
    text = (pathlib.Path(path) / name).read_text()
    (twin / name.replace("quiz", "twin")).write_text(text.replace("quiz", "twin"))
  run = finished_run.open_run(str(tmp_path))
  task_list = tasks.resolve(f"{path},{twin}")
  lm = harness_model.JaxLM.from_run(run)
  results = tasks.run(lm, task_list)
  found = tasks.scores(results)
  assert found["quiz"]["value"] == summary["harness/quiz/acc"] == found["twin"]["value"]
  assert found["average"]["value"] == found["quiz"]["value"]
  written = records.write(run, task_list, results, records.row(run.step, found, 0.3))
  assert written.endswith("eval_harness/quiz+twin.json")
  saved = json.loads(pathlib.Path(written).read_text())
  assert saved["step"] == 40 and saved["results"]["quiz"]["acc,none"] == found["quiz"]["value"]
  last = metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))[-1]
  assert last["event"] == "harness" and last["harness/average/acc"] == found["average"]["value"]
  table = records.format_table([(run.workdir, run.step, found)])
  assert table.splitlines()[0].split()[-2:] == ["average", "(acc)"]


def test_a_config_naming_a_bad_task_folder_is_refused_before_the_run(tmp_path):
  from configs import shakespeare
  from diloco.config import checks

  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "t.yaml").write_text("task: [\n")
  config = shakespeare.get_config("runlocal")
  with config.unlocked():
    config.eval.harness_tasks = str(bad)
  ((key, why),) = checks.problems_of(config)
  assert key == "eval.harness_tasks" and why.startswith(f"{bad}/t.yaml is not a task's YAML")


@pytest.mark.parametrize("kind", ["sentencepiece", "bpe"])
def test_a_runs_own_tokenizer_scores_what_the_harness_encodes(kind, tmp_path):
  """A corpus run's tokenizer (trained here: SentencePiece, or byte-level BPE in a tokenizer.json
  as a pretrained one is read): the harness splits the encoding of context + continuation at the
  context's length, and the adapter scores those ids as the model's own loss does."""
  from diloco.data.corpus import tokenizer_files

  text = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind"] * 20
  out = str(tmp_path / ("t.model" if kind == "sentencepiece" else "t.json"))
  tok = tokenizer_files.BytesTokenizer(tokenizer_files.train(kind, text, 300, out))
  cfg = tr.ModelConfig(
      **{**variants.MODEL_SIZES["tiny"], "vocab_size": tok.vocab_size, "max_len": WINDOW}
  )
  graphdef, state = nnx.split(tr.Transformer(cfg, nnx.Rngs(0)))
  mesh = sharding.make_island_mesh(jax.devices()[:2], 2, 1, 1, 1)
  lm = harness_model.JaxLM(graphdef, nnx.to_pure_dict(state), tok, WINDOW, mesh, 4)
  assert lm.eot_token_id == tok.eod_id  # the empty context's token: its end of document
  pairs = [("To be, or not", " to be"), ("", "Whether"), ("that is the", " question:")]
  requests = [type("Request", (), {"args": p}) for p in pairs]
  got = lm.loglikelihood(requests)
  for (context, continuation), (logp, _) in zip(pairs, got):
    whole = list(tok.encode((context + continuation).encode()))
    head = len(tok.encode(context.encode())) if context else 0
    ids = ([] if context else [tok.eod_id]) + whole
    start = head if context else 1
    want = -_nll_sum(lm, ids[:-1], ids[1:], len(ids) - start)
    assert logp == pytest.approx(want, abs=1e-4)
