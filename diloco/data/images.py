"""Image classification data: scikit-learn's 8x8 handwritten digits, or a user's .npz files.

Digits: the file `sklearn/datasets/data/digits.csv.gz` (1,797 images of 8x8 pixels valued 0-16,
and their labels 0-9) as the scikit-learn wheel ships it. It is read from an installed
scikit-learn if there is one, else from the cache (`<cache>/digits/digits.csv.gz`), else taken
out of the wheel that `pip download --no-deps scikit-learn==1.9.1` fetches (nothing is
installed); its sha256 is checked every time it is read, and a missing or altered file is
refused before anything trains on it. Pixels are scaled to [0, 1]. A fixed permutation
(seed 0) holds out 20% as the validation split.

`npz_glob`: files holding `images` ([N, H, W] or [N, H, W, C], any numeric dtype, scaled by
their maximum if above 1) and `labels` ([N] integers); the validation split is
`val_npz_glob`, or the last 1/10 of the files.

Shards (several learners): iid=True gives every learner all training images in its own order;
iid=False gives learner i the classes c with c % M == i (non-i.i.d. by class).
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import importlib.util
import io
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

from diloco.data import archive as archive_lib, shards

DIGITS_MEMBER = "sklearn/datasets/data/digits.csv.gz"
DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
DIGITS_WHEEL = "scikit-learn==1.9.1"
VAL_SHARE = 0.2


@dataclasses.dataclass(frozen=True)
class ImageSplit:
  images_NxHxWxC: np.ndarray  # float32 in [0, 1]
  labels_N: np.ndarray  # int32

  def __len__(self) -> int:
    return len(self.labels_N)

  def batch(self, records: np.ndarray) -> dict[str, np.ndarray]:
    """The images and labels of these records (TrainBatchSource's and EvalSet's interface)."""
    return {"images_BxHxWxC": self.images_NxHxWxC[records], "labels_B": self.labels_N[records]}

  def classes(self, keep: set[int]) -> "ImageSplit":
    mask = np.isin(self.labels_N, sorted(keep))
    return ImageSplit(self.images_NxHxWxC[mask], self.labels_N[mask])


@dataclasses.dataclass(frozen=True)
class ImageSplits:
  train: ImageSplit
  val: ImageSplit
  num_classes: int

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return tuple(self.train.images_NxHxWxC.shape[1:])


def shard(split: ImageSplit, shard_index: int, num_shards: int, iid: bool) -> ImageSplit:
  """This learner's training images (see the module doc)."""
  shards.check_shard(shard_index, num_shards)
  if iid or num_shards == 1:
    return split
  mine = {int(c) for c in np.unique(split.labels_N) if c % num_shards == shard_index}
  if not mine:
    raise ValueError(f"non-i.i.d. shard {shard_index} of {num_shards} gets no class")
  return split.classes(mine)


# ---- digits ----


def _installed_digits() -> pathlib.Path | None:
  spec = importlib.util.find_spec("sklearn")
  if spec is None or not spec.submodule_search_locations:
    return None
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "datasets/data/digits.csv.gz"
  return path if path.is_file() else None


def _from_wheel(dest: pathlib.Path) -> None:
  """Takes digits.csv.gz out of the scikit-learn wheel pip downloads (nothing installed)."""
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", DIGITS_WHEEL, "-d", tmp]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    wheels = glob.glob(os.path.join(tmp, "*.whl"))
    if result.returncode or not wheels:
      raise RuntimeError(
          f"could not download {DIGITS_WHEEL} with pip to read the digits from it; install "
          f"scikit-learn, or put digits.csv.gz in {dest.parent}. pip said: "
          f"{(result.stderr or result.stdout).strip()[-1000:]}"
      )
    with zipfile.ZipFile(wheels[0]) as wheel:
      data = wheel.read(DIGITS_MEMBER)
  dest.parent.mkdir(parents=True, exist_ok=True)
  tmp_path = dest.with_suffix(".tmp")
  tmp_path.write_bytes(data)
  os.replace(tmp_path, dest)


def digits_file(cache_dir: str | None = None) -> pathlib.Path:
  """The digits file, verified (see the module doc); ValueError if it is not the published one."""
  path = _installed_digits()
  if path is None:
    path = archive_lib.resolve_cache_dir(cache_dir) / "digits" / "digits.csv.gz"
    if not path.exists():
      _from_wheel(path)
  actual = archive_lib.sha256_file(path)
  if actual != DIGITS_SHA256:
    raise ValueError(
        f"sha256 mismatch for the digits file {str(path)!r}: expected {DIGITS_SHA256}, got "
        f"{actual}; refusing to train on it (delete it to fetch it again)"
    )
  return path


def load_digits(cache_dir: str | None = None) -> ImageSplits:
  path = digits_file(cache_dir)
  try:
    text = gzip.decompress(path.read_bytes()).decode("ascii")
    table = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.float32)
  except (OSError, EOFError, UnicodeDecodeError, ValueError) as err:
    raise ValueError(f"the digits file {str(path)!r} cannot be read: {err}") from err
  if table.shape != (1797, 65):
    raise ValueError(f"the digits file has shape {table.shape}, expected (1797, 65)")
  images = (table[:, :64] / 16.0).reshape(-1, 8, 8, 1)
  labels = table[:, 64].astype(np.int32)
  order = np.random.default_rng(0).permutation(len(labels))
  cut = len(labels) - int(round(VAL_SHARE * len(labels)))
  train, val = order[:cut], order[cut:]
  return ImageSplits(
      ImageSplit(images[train], labels[train]), ImageSplit(images[val], labels[val]), 10
  )


# ---- a user's .npz files ----


def _read_npz(paths: list[str]) -> ImageSplit:
  images, labels = [], []
  for path in paths:
    try:
      with np.load(path) as f:
        x, y = np.asarray(f["images"]), np.asarray(f["labels"])
    except (OSError, KeyError, ValueError) as err:
      raise ValueError(f"{path}: not an .npz with 'images' and 'labels' ({err})") from err
    if x.ndim == 3:
      x = x[..., None]
    if x.ndim != 4 or y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
      raise ValueError(f"{path}: images {x.shape} and labels {y.shape} {y.dtype} do not match")
    images.append(x.astype(np.float32))
    labels.append(y.astype(np.int32))
  if len({x.shape[1:] for x in images}) != 1:
    raise ValueError(f"images of different shapes: {sorted({x.shape[1:] for x in images})}")
  x = np.concatenate(images)
  top = float(x.max()) if x.size else 1.0
  return ImageSplit(x / top if top > 1 else x, np.concatenate(labels))


def load_npz(glob_pattern: str, val_glob: str = "") -> ImageSplits:
  files = sorted(glob.glob(glob_pattern, recursive=True))
  if not files:
    raise ValueError(f"data.npz_glob={glob_pattern!r} matches no file")
  val_files = sorted(glob.glob(val_glob, recursive=True)) if val_glob else []
  if not val_files:
    if len(files) < 2:
      raise ValueError("data.npz_glob needs 2 files or more to hold one out (or val_npz_glob)")
    cut = len(files) - max(1, len(files) // 10)
    files, val_files = files[:cut], files[cut:]
  train, val = _read_npz(files), _read_npz(val_files)
  if train.images_NxHxWxC.shape[1:] != val.images_NxHxWxC.shape[1:]:
    raise ValueError("training and validation images differ in shape")
  return ImageSplits(train, val, int(max(train.labels_N.max(), val.labels_N.max())) + 1)
