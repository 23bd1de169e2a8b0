"""Several prepared corpora trained on as one mixture (data.corpus 'a,b', data.corpus_weights).

Weights are shares of the training tokens: 'web=0.7, code=0.3' means 70% of the tokens a reader
gives come from web. grain mixes documents, so each corpus's document weight is its token share
over its mean document length (end-of-document id included) in this reader's shards. Without
weights each corpus counts by its tokens, as if the corpora were one. A reader counts the tokens
it gave from each corpus (`Counted`); the count is part of its checkpointed state, and the
summary adds up the counts of a run's readers (`contributions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grain
import numpy as np

from diloco import errors

SOURCE = "corpus_BxL"  # the batch field naming each token's corpus (removed by `Counted`)


def directories(corpus: str) -> list[str]:
  """data.corpus as its corpora: 'gs://b/web,gs://b/code' -> two directories."""
  out = [d.strip() for d in corpus.split(",") if d.strip()]
  if len(set(out)) != len(out):
    raise errors.InputError(f"data.corpus={corpus!r} names a corpus twice")
  return out


def weights(text: str, count: int, tokens: Sequence[int]) -> list[float]:
  """data.corpus_weights ('0.7,0.3') as token shares summing to 1; '' = by each corpus's tokens.
  ValueError naming the key for a wrong count or a weight that is not positive."""
  if not text.strip():
    return [t / sum(tokens) for t in tokens]
  try:
    got = [float(w) for w in text.split(",")]
  except ValueError as e:
    raise errors.InputError(f"data.corpus_weights={text!r}: {e}") from e
  if len(got) != count:
    raise errors.InputError(
        f"data.corpus_weights={text!r} gives {len(got)} weights for {count} corpora in data.corpus"
    )
  if any(not w > 0 for w in got):
    raise errors.InputError(f"data.corpus_weights={text!r}: every weight must be > 0")
  return [w / sum(got) for w in got]


def document_weights(shares: Sequence[float], tokens: Sequence[int], documents: Sequence[int]):
  """grain's mixing weights (per document) that give each corpus its share of the tokens: share
  over mean document length, each document followed by one end-of-document id."""
  return [s / ((t + d) / d) for s, t, d in zip(shares, tokens, documents)]


class Counted(grain.IterDataset):
  """Batches with their `SOURCE` field removed and counted: the iterator's `tokens` (and state)
  hold the input tokens it gave from each of `count` corpora."""

  def __init__(self, parent: grain.IterDataset, count: int):
    super().__init__(parent)
    self._count = count

  def __iter__(self) -> _CountedIterator:
    return _CountedIterator(self._parent.__iter__(), self._count)


class _CountedIterator(grain.DatasetIterator):

  def __init__(self, parent: grain.DatasetIterator, count: int):
    super().__init__(parent)
    self.tokens = [0] * count

  def __next__(self) -> dict:
    batch = dict(next(self._parent))
    got = np.bincount(batch.pop(SOURCE).ravel(), minlength=len(self.tokens))
    self.tokens = [a + int(b) for a, b in zip(self.tokens, got)]
    return batch

  def get_state(self) -> dict:
    return {"parent": self._parent.get_state(), "tokens": list(self.tokens)}

  def set_state(self, state: dict) -> None:
    self._parent.set_state(state["parent"])
    self.tokens = [int(t) for t in state["tokens"]]


def contributions(
    names: Sequence[str], shares: Sequence[float], counts: Iterable[Sequence[int]]
) -> list[dict]:
  """summary.json's `data.mixture`: per corpus its weight, the tokens the readers gave from it
  (summed over `counts`, one list per reader) and their share of all."""
  total = np.zeros(len(names), np.int64)
  for c in counts:
    total += np.asarray(c, np.int64)
  whole = int(total.sum())
  return [
      {"corpus": n, "weight": round(w, 6), "tokens": int(t), "share": t / whole if whole else 0.0}
      for n, w, t in zip(names, shares, total)
  ]


def read_tokens(iters: Iterable) -> list[int] | None:
  """The tokens per corpus the `Counted` iterators among `iters` gave, summed (None: none is)."""
  counts = [it.tokens for it in iters if isinstance(it, _CountedIterator)]
  return [int(sum(c)) for c in zip(*counts)] if counts else None
