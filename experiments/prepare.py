r"""Prepares a pre-training corpus: trains a tokenizer once, then writes token shards.

  # a byte-level BPE (or --kind=sentencepiece, to a .model) trained on a sample of the inputs
  python -m experiments.prepare tokenizer --inputs='data/*.jsonl' --format=jsonl --field=text \
      --kind=bpe --vocab_size=32768 --tokenizer=corpus/tokenizer.json
  # ArrayRecord shards of token ids and their manifest; resumable: run it again after a kill
  python -m experiments.prepare shards --inputs='data/*.jsonl' --format=jsonl --field=text \
      --tokenizer=corpus/tokenizer.json --output=corpus/tokens --shards=64 --workers=8

Inputs, tokenizer and output may be local paths or bucket URLs (gs://, s3://: any file system
fsspec serves). --format: text (a file is a document), jsonl (--field of each line), parquet
(--field column). --tokenizer in `shards` may be any SentencePiece .model or Hugging Face
tokenizer.json; its end-of-document token is the model's own, or --eod_token.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from diloco import errors
from diloco.config import cli as config_cli
from diloco.data.corpus import documents, prepare, tokenizer_files

_INPUTS = flags.DEFINE_list("inputs", None, "Globs of input files (comma-separated).")
_FORMAT = flags.DEFINE_enum("format", "jsonl", documents.FORMATS, "What the inputs hold.")
_FIELD = flags.DEFINE_string("field", "text", "jsonl: the field; parquet: the column.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "The tokenizer file (.model or .json).")
_EOD = flags.DEFINE_string("eod_token", None, "The end-of-document token, if not the model's.")
_OUTPUT = flags.DEFINE_string("output", None, "shards: the corpus directory.")
_SHARDS = flags.DEFINE_integer("shards", 16, "shards: how many (at least learners x processes).")
_WORKERS = flags.DEFINE_integer("workers", 1, "shards: processes writing shards at once.")
_KIND = flags.DEFINE_enum("kind", "bpe", tokenizer_files.TRAINABLE, "tokenizer: what to train.")
_VOCAB = flags.DEFINE_integer("vocab_size", 32768, "tokenizer: its vocabulary.")
_SAMPLE = flags.DEFINE_integer("sample_bytes", 1 << 30, "tokenizer: text it is trained on.")
_PROGRESS = flags.DEFINE_bool("progress", True, "shards: a progress bar.")
flags.mark_flags_as_required(["inputs", "tokenizer"])

COMMANDS = ("tokenizer", "shards")


def main(argv: Sequence[str]) -> None:
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise errors.InputError(f"say what to prepare: one of {COMMANDS}, got {argv[1:]}")
  if argv[1] == "tokenizer":
    texts = prepare.sample_texts(_INPUTS.value, _FORMAT.value, _FIELD.value, _SAMPLE.value)
    tok = tokenizer_files.train(_KIND.value, texts, _VOCAB.value, _TOKENIZER.value)
    print(
        f"{tok.path}: {tok.kind}, {tok.vocab_size} ids, end of document {tok.eod_id}, sha256 {tok.sha256[:12]}"
    )
    return
  if not _OUTPUT.value:
    raise errors.InputError("shards needs --output")
  spec = prepare.Spec(
      tuple(_INPUTS.value),
      _FORMAT.value,
      _TOKENIZER.value,
      _OUTPUT.value,
      _SHARDS.value,
      _FIELD.value,
      _EOD.value,
  )
  m = prepare.prepare(spec, workers=_WORKERS.value, progress=_PROGRESS.value)
  print(
      f"{spec.output}: {len(m.shards)} shards, {m.documents:,} documents, {m.tokens:,} tokens, "
      f"vocabulary {m.vocab_size}, end of document {m.eod_id}"
  )


if __name__ == "__main__":
  config_cli.run(main)
