"""The cost of a checkpoint's integrity check, local disk against a bucket: python -m
scripts.bench_manifest [--mib=64].

Saves one orbax checkpoint of a state of `--mib` MiB (float32 arrays of 4 MiB) to a local
directory and to a bucket on the Cloud Storage server of tests/object_store.py, then times
writing its manifest and checking it (diloco/inner/manifest.py). On a local disk both read every
byte (sha256); in a bucket both are one listing of the store's CRC32Cs and read no byte back.
Prints the seconds of each and the bytes each had to read.
"""

import argparse
import os
import sys
import tempfile
import time

import jax.numpy as jnp
import numpy as np

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

from diloco import paths  # noqa: E402
from diloco.inner import checkpoint, manifest  # noqa: E402
from object_store import gcs_server  # noqa: E402


def _measure(directory: str, state: dict) -> dict:
  ckpt = checkpoint.Checkpointer(directory, every=1, async_save=False)
  ckpt.save(1, state, force=True)
  ckpt.close()
  step_dir = paths.join(directory, "1")
  t = time.perf_counter()
  manifest.write(step_dir)
  write_s = time.perf_counter() - t
  t = time.perf_counter()
  assert manifest.problem(step_dir) is None
  check_s = time.perf_counter() - t
  files = paths.files(step_dir)
  stored = sum(int(i["size"]) for i in files.values())
  read = stored if paths.is_local(step_dir) else 0
  return {
      "write_s": write_s,
      "check_s": check_s,
      "files": len(files),
      "stored": stored,
      "read": read,
  }


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--mib", type=int, default=64)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  state = {
      f"w{i}": jnp.asarray(rng.standard_normal(1 << 20, np.float32)) for i in range(args.mib // 4)
  }
  local = _measure(tempfile.mkdtemp(prefix="bench-manifest-"), state)
  with gcs_server() as url:
    bucket = _measure(f"{url}/bench", state)
  for name, r in (("local (sha256)", local), ("bucket (crc32c)", bucket)):
    print(
        f"{name:16s} files {r['files']:4d}  stored {r['stored'] / 2**20:7.1f} MiB  "
        f"read {r['read'] / 2**20:7.1f} MiB  write {r['write_s']:.3f} s  check {r['check_s']:.3f} s"
    )
  print(f"check time bucket/local: {bucket['check_s'] / local['check_s']:.3f}")


if __name__ == "__main__":
  main()
