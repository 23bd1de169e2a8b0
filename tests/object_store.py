"""A real Cloud Storage server on the loopback for tests: the `gcp-storage-emulator` package's, in
memory, one bucket, with Cloud Storage's generation preconditions (tests/gcs_server.py). gcsfs (and so fsspec's gs://) talks to it through STORAGE_EMULATOR_HOST; the
environment the fixture sets is inherited by the processes a test starts.

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

BUCKET = "diloco-test"


@contextlib.contextmanager
def gcs_server():
  """Yields the bucket's URL (gs://BUCKET) while a server runs; the environment points at it."""
  port = local.free_port()
  proc = subprocess.Popen(
      [sys.executable, "-m", "tests.gcs_server", "start", "--host", "127.0.0.1"]
      + ["--port", str(port), "--in-memory", "--default-bucket", BUCKET],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  env = {
      "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}",
      "TENSORSTORE_GCS_HTTP_URL": f"http://127.0.0.1:{port}",  # orbax's arrays (tensorstore)
      # gcsfs would first ask a gRPC endpoint whether the bucket is hierarchical (60 s to fail)
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
  }
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
