"""Data: the Shakespeare corpus, grain sources, tokenizers and the training/evaluation pipeline."""

from diloco.data.held_out import describe
from diloco.data.pipeline import (
    Datasets,
    build_datasets,
    load_splits,
    make_datasets,
    reuse_splits,
)
from diloco.data.corpus.splits import check as check_corpus
from diloco.data.shakespeare import ensure_prepared, prepare_corpus, PreparedCorpus
from diloco.data.sources import PackedTokenSource, write_array_record

__all__ = [
    "Datasets",
    "PackedTokenSource",
    "PreparedCorpus",
    "build_datasets",
    "check_corpus",
    "describe",
    "load_splits",
    "make_datasets",
    "reuse_splits",
    "ensure_prepared",
    "prepare_corpus",
    "write_array_record",
]
