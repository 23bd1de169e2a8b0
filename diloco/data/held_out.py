"""What a run evaluates on: the validation records evaluation draws its fixed batches from, the
evaluation set (the same for every shard, batch size and mode), and what a run trains and
evaluates on as its summary states it."""

from __future__ import annotations

from typing import Any

import ml_collections

from diloco.data import batching, images, sources
from diloco.data.batching import EvalSet
from diloco.data.corpus import splits as corpus_splits, stream
from diloco.data.corpus.splits import CorpusSplits
from diloco.data.sources import Splits


def eval_source(splits: Splits | images.ImageSplits, seq_len: int):
  """The validation records evaluation draws its fixed batches from."""
  if isinstance(splits, images.ImageSplits):
    return splits.val
  if isinstance(splits, CorpusSplits):
    return stream.PackedDocuments(splits.val.tokens, seq_len, splits.eod_id)
  return sources.PackedTokenSource(splits.val.tokens, seq_len)


def eval_set(
    splits: Splits | images.ImageSplits,
    data_cfg: ml_collections.ConfigDict,
    *,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
) -> EvalSet:
  """The run's evaluation set: `data.eval_sequences` and `data.final_eval_sequences` records spread
  over the validation split, which depend on the data config and seq_len only."""
  val = eval_source(splits, seq_len)
  return EvalSet(
      val,
      batching.eval_sample(len(val), data_cfg.eval_sequences),
      batching.eval_sample(len(val), data_cfg.final_eval_sequences),
      data_cfg.eval_batch_size,
      process_index,
      process_count,
  )


def describe(
    splits: Splits | images.ImageSplits, data_cfg: ml_collections.ConfigDict, *, seq_len: int
) -> dict[str, Any]:
  """What a run trains and evaluates on (summary.json's `data`): each split's size; the sequences
  (images), tokens and bytes of the evaluation sample and of the final evaluation, and the sha256
  of each (`final_eval_sha256` identifies what the summary's eval_* measure)."""
  held = eval_set(splits, data_cfg, seq_len=seq_len)
  if isinstance(splits, images.ImageSplits):
    out = {"source": data_cfg.source, "classes": splits.num_classes}
    out.update(train_images=len(splits.train), val_images=len(splits.val))
    bytes_per_token = 0.0
  elif isinstance(splits, CorpusSplits):
    out, bytes_per_token = corpus_splits.describe(splits), splits.bytes_per_token
  else:
    out = {"source": data_cfg.source, "tokenizer": data_cfg.tokenizer}
    out["vocab_size"] = splits.vocab_size
    for name, corpus in (("train", splits.train), ("val", splits.val)):
      out[f"{name}_tokens"] = len(corpus.tokens)
      out[f"{name}_bytes"] = corpus.num_bytes
      out[f"{name}_documents"] = len(corpus.names)
    bytes_per_token = splits.val.num_bytes / len(splits.val.tokens)
  for prefix, final in (("eval", False), ("final_eval", True)):
    n = len(held.records(final))
    out[f"{prefix}_sequences"] = n
    if bytes_per_token:
      out[f"{prefix}_tokens"] = n * seq_len
      out[f"{prefix}_bytes"] = round(n * seq_len * bytes_per_token)
    out[f"{prefix}_sha256"] = held.sha256(final)
  return out
