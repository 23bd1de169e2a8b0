"""Data: the Shakespeare corpus, grain sources, tokenizers and the training/evaluation pipeline."""

from diloco.data.pipeline import (
    Datasets,
    build_datasets,
    load_splits,
    make_datasets,
)
from diloco.data.shakespeare import ensure_prepared, prepare_corpus, PreparedCorpus
from diloco.data.sources import PackedTokenSource, write_array_record

__all__ = [
    "Datasets",
    "PackedTokenSource",
    "PreparedCorpus",
    "build_datasets",
    "load_splits",
    "make_datasets",
    "ensure_prepared",
    "prepare_corpus",
    "write_array_record",
]
