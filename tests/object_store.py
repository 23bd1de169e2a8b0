"""A real Cloud Storage server on the loopback for tests: `python -m experiments.gcs_emulator` (the
`gcp-storage-emulator` package's, with Cloud Storage's generation preconditions), in memory, one
bucket. gcsfs (and so fsspec's gs://) and tensorstore talk to it through the environment
`gcs_emulator.environment` names, which the fixture sets and the processes a test starts inherit.

Why this server: gcsfs reaches it with its own client, unmocked, over HTTP (moto's S3 server would
serve s3fs the same way; Cloud Storage is what TPU users have).
"""

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest

from diloco.rpc import local
from experiments import gcs_emulator

BUCKET = "diloco-test"


@contextlib.contextmanager
def gcs_server():
  """Yields the bucket's URL (gs://BUCKET) while a server runs; the environment points at it."""
  port = local.free_port()
  proc = subprocess.Popen(
      [sys.executable, "-m", "experiments.gcs_emulator", "start", "--host", "127.0.0.1"]
      + ["--port", str(port), "--in-memory", "--default-bucket", BUCKET],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  env = gcs_emulator.environment("127.0.0.1", port)
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    deadline = time.monotonic() + 30
    while True:
      try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        break
      except OSError:
        if proc.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f"the Cloud Storage emulator did not start on port {port}")
        time.sleep(0.1)
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()  # (instances remember the endpoint)
    yield f"gs://{BUCKET}"
  finally:
    proc.terminate()
    proc.wait(10)
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


@pytest.fixture
def bucket():
  with gcs_server() as url:
    yield url
