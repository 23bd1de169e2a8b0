"""Sizes bounded by what can exist, checked before anything is written: a batch whose logits
alone exceed the memory that will hold them, more learners than documents to give them.

The logits of one step (sequences x seq_len x vocabulary, float32) are a lower bound on the step's
memory: the models compute them whole. Every config check bounds them by the largest machine that
exists, a whole TPU v5p pod (8,960 chips of 95 GB HBM, cloud.google.com/tpu/docs/v5p; a launcher
checks a TPU run on a laptop); a run that trains in one process on this machine's CPU is bounded by
its memory as well (`train_and_evaluate`). `experiments.plan` tells the real figure for a slice.
"""

import os

import ml_collections

Problems = list[tuple[str, str]]
LARGEST_POD_BYTES = 8960 * 95e9
POD = "a whole TPU v5p pod's HBM (8,960 chips x 95 GB)"
IMAGE_SOURCES = ("digits", "npz_glob")


def _vocabulary(c) -> int:
  return 256 if c.data.tokenizer == "byte" else int(c.data.sp_vocab_size)


def local_memory() -> tuple[float, str]:
  """(bytes, what they are) of this machine's memory: the bound of a run on its CPU."""
  return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "this machine's memory"


def _largest_batch(c) -> tuple[str, int]:
  """(key, sequences) of the largest batch a step or an evaluation pass takes."""
  batches = [
      ("batch_size", int(c.batch_size)),
      ("data.eval_batch_size", int(c.data.eval_batch_size)),
  ]
  text = str(c.get("sim", {}).get("batch_sizes", "")) if "sim" in c else ""
  for part in filter(None, text.split(",")):
    try:
      batches.append(("sim.batch_sizes", int(part)))
    except ValueError:
      pass  # the domain checks name it
  return max(batches, key=lambda kb: kb[1])


def problems(
    c: ml_collections.ConfigDict,
    limit: tuple[float, str] = (LARGEST_POD_BYTES, POD),
    vocab: int | None = None,
) -> Problems:
  """A batch whose float32 logits alone exceed `limit` (default: the largest machine there is),
  naming the keys. `vocab`: the loaded data's vocabulary (a corpus's is known only then; before,
  the tokenizer setting's)."""
  if c.data.source in IMAGE_SOURCES:
    return []
  try:
    key, batch = _largest_batch(c)
    seq, vocab = int(c.seq_len), vocab or _vocabulary(c)
  except (TypeError, ValueError, KeyError):
    return []  # the domain checks name the bad key
  logits = 4.0 * batch * seq * vocab
  limit, what = limit
  if logits <= limit:
    return []
  return [
      (
          key,
          f"{batch:,} sequences x seq_len {seq:,} x vocabulary {vocab:,} float32 logits alone "
          f"are {logits / 2**30:,.1f} GiB, more than {what} ({limit / 2**30:,.1f} GiB); lower "
          f"{key} or seq_len",
      )
  ]


PLACEHOLDER_VOCAB = 256  # model.vocab_size's default, which the tokenizer's size replaces


def data_problems(
    c: ml_collections.ConfigDict, splits, limit: tuple[float, str] = (LARGEST_POD_BYTES, POD)
) -> Problems:
  """What the loaded data refuses: a model.vocab_size given that is not the tokenizer's; more
  learners than training documents when each learner trains on its own (data.iid=False); a batch
  whose logits over the data's own vocabulary exceed `limit`."""
  found = _vocab_problems(c, splits) + _learner_problems(c, splits)
  return found or problems(c, limit, getattr(splits, "vocab_size", None))  # (images: none)


def _vocab_problems(c: ml_collections.ConfigDict, splits) -> Problems:
  """The model's vocabulary is the tokenizer's: a different value given is refused, not
  replaced (256, the default, is replaced)."""
  if c.data.source in IMAGE_SOURCES:  # (there, model.vocab_size is the number of classes)
    return []
  given, data = int(c.model.vocab_size), int(splits.vocab_size)
  if given in (PLACEHOLDER_VOCAB, data):
    return []
  where = f"the corpus {c.data.corpus}" if c.data.source == "corpus" else "the run's tokenizer"
  return [
      (
          "model.vocab_size",
          f"{given:,} given, but {where} has {data:,} ids: leave model.vocab_size out (the "
          f"tokenizer's size is used) or give {data}",
      )
  ]


def _learner_problems(c: ml_collections.ConfigDict, splits) -> Problems:
  if c.mode in ("dp", "compare") or c.data.get("iid", False):
    return []
  manifest = getattr(splits, "manifest", None)  # a prepared corpus: whole shards per learner
  if manifest is not None and c.outer.learners > len(manifest.shards):
    return [
        (
            "outer.learners",
            f"{c.outer.learners:,} learners but the corpus {c.data.corpus} has "
            f"{len(manifest.shards)} shards, and with data.iid=False each learner reads shards of "
            "its own; lower outer.learners, prepare more shards, or set data.iid=True",
        )
    ]
  documents = len(getattr(getattr(splits, "train", None), "names", ()) or ())
  if documents and c.outer.learners > documents:
    return [
        (
            "outer.learners",
            f"{c.outer.learners:,} learners but the training split has {documents} documents, and "
            "with data.iid=False each learner trains on whole documents of its own; lower "
            "outer.learners or set data.iid=True",
        )
    ]
  return []
