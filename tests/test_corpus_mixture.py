"""Mixtures of prepared corpora (diloco/data/corpus/mixture.py): weights are token shares, turned
into grain's document weights; each reader counts the tokens it gave from each corpus, in its
checkpointed state."""

import numpy as np
import pytest

from diloco.data.corpus import mixture, stream
from test_corpus_stream import _corpus


def test_weights_are_token_shares_and_bad_ones_are_named():
  assert mixture.weights("1,3", 2, [10, 10]) == [0.25, 0.75]
  assert mixture.weights("", 2, [300, 100]) == [0.75, 0.25]  # by tokens, as if one corpus
  with pytest.raises(ValueError, match=r"corpus_weights='1' gives 1 weights for 2 corpora"):
    mixture.weights("1", 2, [1, 1])
  with pytest.raises(ValueError, match="every weight must be > 0"):
    mixture.weights("1,0", 2, [1, 1])
  with pytest.raises(ValueError, match="names a corpus twice"):
    mixture.directories("a,b,a")
  # Documents of a: 300 tokens in 10 (31 a document with its end id), b: 100 in 50 (3): half
  # the tokens each takes a document of a for every 31/3 of b's.
  a, b = mixture.document_weights([0.5, 0.5], [300, 100], [10, 50])
  assert a == pytest.approx(0.5 / 31) and b == pytest.approx(0.5 / 3)


def test_contributions_sum_the_readers_counts():
  got = mixture.contributions(["a", "b"], [0.25, 0.75], [[10, 20], [15, 55]])
  assert got == [
      {"corpus": "a", "weight": 0.25, "tokens": 25, "share": 0.25},
      {"corpus": "b", "weight": 0.75, "tokens": 75, "share": 0.75},
  ]


def _mix(tmp_path, shares, seed=0):
  # a: documents of 3 ids (4 tokens with the end id) from 1-49; b: of 9 ids (10) from 50-99.
  rng = np.random.default_rng(1)
  a = _corpus(tmp_path / "a", [[list(rng.integers(1, 50, 3)) for _ in range(40)]] * 2)
  b = _corpus(tmp_path / "b", [[list(rng.integers(50, 100, 9)) for _ in range(20)]] * 2)
  sources = []
  for name, m in (("a", a), ("b", b)):
    paths = stream.local_shards(str(tmp_path / name), m, [0, 1], str(tmp_path / "cache"))
    sources.append(stream.Source(paths, list(m.shards), m))
  weights = mixture.document_weights(shares, [a.tokens, b.tokens], [a.documents, b.documents])
  return stream.mixed(sources, weights, seed=seed, seq_len=16, batch_size=4)


def test_a_mixture_gives_each_corpus_its_share_of_the_tokens_and_resumes(tmp_path):
  it = iter(_mix(tmp_path, [0.5, 0.5]))
  from_b = 0
  for _ in range(100):
    batch = next(it)
    assert "corpus_BxL" not in batch  # counted, not sent to the model
    from_b += int((batch["inputs_BxL"] >= 50).sum())
  # 6,400 input tokens: half from each (b's documents are 2.5x as long, so grain takes 2.5 of
  # a's for each of b's); b's ids alone (without its end ids, 1 in 10) are 90% of its share.
  assert sum(it.tokens) == 100 * 4 * 16
  assert it.tokens[1] / 6400 == pytest.approx(0.5, abs=0.02)
  assert from_b == pytest.approx(0.9 * it.tokens[1], abs=16)
  state = it.get_state()
  want = [next(it)["inputs_BxL"] for _ in range(3)]
  again = iter(_mix(tmp_path, [0.5, 0.5]))
  again.set_state(state)
  assert again.tokens == state["tokens"]
  np.testing.assert_array_equal(np.stack([next(again)["inputs_BxL"] for _ in range(3)]), want)
  # At shares 0.8 / 0.2 the count follows.
  skewed = iter(_mix(tmp_path, [0.8, 0.2]))
  for _ in range(100):
    next(skewed)
  assert skewed.tokens[0] / 6400 == pytest.approx(0.8, abs=0.02)
