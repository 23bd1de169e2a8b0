"""Keys that only mean something with another key set (a source's glob, an optimizer's
constants), sources without the files they need, and validation files that are training files."""

from typing import Any

Problems = list[tuple[str, str]]  # (key, why)


def has(c, key: str) -> bool:
  """Whether the config has the dotted key."""
  try:
    get(c, key)
  except (KeyError, AttributeError):
    return False
  return True


def get(c, path: str) -> Any:
  """The value of the dotted key `path` (KeyError or AttributeError where it is missing)."""
  for part in path.split("."):
    c = c[part]
  return c


# Keys that change nothing unless another key has a value: (key, its default, needs, the value).
DEPENDENT = (
    ("data.text_glob", "", "data.source", "text_glob"),
    ("data.val_text_glob", "", "data.source", "text_glob"),
    ("data.array_record_glob", "", "data.source", "array_record"),
    ("data.val_array_record_glob", "", "data.source", "array_record"),
    ("data.npz_glob", "", "data.source", "npz_glob"),
    ("data.val_npz_glob", "", "data.source", "npz_glob"),
    ("data.corpus", "", "data.source", "corpus"),
    ("data.val_corpus", "", "data.source", "corpus"),
    ("data.corpus_weights", "", "data.source", "corpus"),
    ("data.sp_vocab_size", 1024, "data.tokenizer", "sentencepiece"),
    ("outer.delayed_period", 4, "outer.optimizer", "delayed_nesterov"),
    ("outer.delayed_c", 0.0, "outer.optimizer", "delayed_nesterov"),
    ("optimizer.weight_decay_time_constant", 0, "optimizer.weight_decay_kind", "independent"),
)
# Sources that need their glob.
NEEDS = (
    ("data.source", "text_glob", "data.text_glob"),
    ("data.source", "array_record", "data.array_record_glob"),
    ("data.source", "npz_glob", "data.npz_glob"),
    ("data.source", "corpus", "data.corpus"),
    ("data.source", "corpus", "data.val_corpus"),
)


def problems(c) -> Problems:
  """Keys set without the key they depend on, sources without their files, a validation glob
  that matches training files."""
  return _dependent(c) + _val_overlap(c)


def _dependent(c) -> Problems:
  out = _recipe_keys(c)
  for key, default, needs, value in DEPENDENT:
    if has(c, key) and get(c, key) != default and get(c, needs) != value:
      out.append((key, f"only used with {needs}={value!r} (it is {get(c, needs)!r}): set both"))
  for key, value, needs in NEEDS:
    if get(c, key) == value and not get(c, needs):
      out.append((needs, f"{key}={value!r} needs it (the files to train on)"))
  return out


def _recipe_keys(c) -> Problems:
  """An independent decay needs its time constant; the ViT's objective has no output z-loss."""
  out = []
  o = c.optimizer
  if o.get("weight_decay_kind") == "independent" and not o.weight_decay_time_constant >= 1:
    out.append(
        (
            "optimizer.weight_decay_time_constant",
            "weight_decay_kind='independent' needs T >= 1 steps (lambda = 1/T)",
        )
    )
  if c.model.get("z_loss", 0.0) > 0 and c.data.source in ("digits", "npz_glob"):
    out.append(("model.z_loss", "the ViT's objective (image data) has no output z-loss: set 0"))
  return out


# Each source's training glob and the validation glob that must match none of its files.
VAL_GLOBS = (
    ("text_glob", "data.text_glob", "data.val_text_glob"),
    ("array_record", "data.array_record_glob", "data.val_array_record_glob"),
    ("npz_glob", "data.npz_glob", "data.val_npz_glob"),
)


def _val_overlap(c) -> Problems:
  """A validation glob that matches a training file: validation would score training data."""
  from diloco.data import sources

  out = []
  for source, train_key, val_key in VAL_GLOBS:
    if c.data.source != source or not has(c, val_key) or not get(c, val_key):
      continue
    train, val = get(c, train_key), get(c, val_key)
    if val == train:
      out.append((val_key, f"is {train_key}: validation would score training data"))
    elif train and (shared := sources.shared_file(train, val)):
      why = f"matches {shared}, a {train_key} file: validation would score training data"
      out.append((val_key, f"{why}; make the two globs match disjoint files"))
  return out
