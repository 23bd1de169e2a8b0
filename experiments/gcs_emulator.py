r"""A Cloud Storage server on the loopback, for trying bucket workdirs and corpora without a cloud:
the `gcp-storage-emulator` package's (pip install -e '.[emulator]'), with Cloud Storage's
generation preconditions, which the plain emulator ignores.

  python -m experiments.gcs_emulator start --port=9023 --default-bucket=my-bucket --in-memory
  # then, in the shell that runs the commands (it prints these three lines when it starts):
  export STORAGE_EMULATOR_HOST=http://localhost:9023 TENSORSTORE_GCS_HTTP_URL=http://localhost:9023
  export GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false

STORAGE_EMULATOR_HOST points gcsfs (fsspec's gs://: corpora, workdirs, metrics) at it,
TENSORSTORE_GCS_HTTP_URL points orbax's arrays (tensorstore) at it, and
GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false stops gcsfs asking a gRPC endpoint whether the bucket is
hierarchical first (60 s to fail on every new file system). Arguments are the emulator's own
(`start --help`).

Why not the plain emulator: tensorstore's OCDBT (orbax's checkpoint format) keeps its manifest
by conditional requests: a read with `ifGenerationNotMatch` must answer 304 when the object is
unchanged, and an answer's generation is read from the `x-goog-generation` header. The emulator
answers 200 without the header, and one save in three of the runlocal job failed with
tensorstore's "Malformed StorageGeneration". Here a download carries its generation, and
`ifGenerationMatch` / `ifGenerationNotMatch` are honoured on downloads (304 / 412) and
`ifGenerationMatch` on uploads (412), as Cloud Storage does
(cloud.google.com/storage/docs/request-preconditions).
"""

import argparse
import socketserver
import sys
import time
from http import HTTPStatus

try:
  from gcp_storage_emulator import __main__ as emulator_main, server
  from gcp_storage_emulator.exceptions import NotFound
  from gcp_storage_emulator.handlers import objects
except ImportError:  # without the extra: `main` says how to install it
  emulator_main = None


def _query(request, name: str) -> str | None:
  values = request.query.get(name)
  return values[0] if values else None


def _generation(storage, bucket: str, name: str) -> str:
  """The object's generation, "0" when there is none (Cloud Storage's "does not exist")."""
  try:
    return str(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    return "0"


def _download(request, response, storage, *args, **kwargs):
  bucket, name = request.params["bucket_name"], request.params["object_id"]
  have = _generation(storage, bucket, name)
  match, not_match = _query(request, "ifGenerationMatch"), _query(request, "ifGenerationNotMatch")
  if have != "0":
    if not_match is not None and not_match == have:
      response.status = HTTPStatus.NOT_MODIFIED
      return None
    if match is not None and match != have:
      response.status = HTTPStatus.PRECONDITION_FAILED
      return None
    response["x-goog-generation"] = have
  return _plain_download(request, response, storage, *args, **kwargs)


def _insert(request, response, storage, *args, **kwargs):
  match = _query(request, "ifGenerationMatch")
  name = _query(request, "name")
  if match is not None and name is not None:  # (a multipart upload names it in its body)
    if _generation(storage, request.params["bucket_name"], name) != match:
      response.status = HTTPStatus.PRECONDITION_FAILED
      return None
  return _plain_insert(request, response, storage, *args, **kwargs)


if emulator_main is not None:
  _plain_download, _plain_insert = objects.download, objects.insert
  objects.download = _download  # (objects.get calls it by this name for alt=media)
  swap = {_plain_download: _download, _plain_insert: _insert}
  server.HANDLERS = tuple(
      (regex, {method: swap.get(fn, fn) for method, fn in handlers.items()})
      for regex, handlers in server.HANDLERS
  )


def environment(host: str, port: int) -> dict[str, str]:
  """The environment that points gcsfs and tensorstore at a server on host:port."""
  url = f"http://{host}:{port}"
  return {
      "STORAGE_EMULATOR_HOST": url,
      "TENSORSTORE_GCS_HTTP_URL": url,
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
      # tensorstore's credentials: a fixed token, not an ERROR line for the missing gcloud file
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
  }


def main(argv: list[str]) -> None:
  """The emulator's own command; `start` prints the environment's `export` line once the server
  answers (so `... > emulator.env &` then `source emulator.env` is ready to use) and serves until
  interrupted."""
  if emulator_main is None:
    print("error: the emulator is an extra: pip install -e '.[emulator]'", file=sys.stderr)
    sys.exit(2)
  if argv[:1] != ["start"]:
    emulator_main.main(argv)
    return
  where = argparse.ArgumentParser(add_help=False)
  where.add_argument("--host", default="localhost")
  where.add_argument("--port", type=int, default=9023)
  known, _ = where.parse_known_args(argv)
  plain = socketserver.BaseServer.handle_error

  def handle_error(self, request, client_address):
    if not isinstance(sys.exc_info()[1], ConnectionError):  # not a client that hung up early
      plain(self, request, client_address)

  socketserver.BaseServer.handle_error = handle_error
  server = emulator_main.main(argv, test_mode=True)  # built, not yet serving
  server.start()
  try:
    env = environment(known.host, known.port)
    print(" ".join(["export", *(f"{k}={v}" for k, v in env.items())]), flush=True)
    while True:
      time.sleep(1)
  except KeyboardInterrupt:
    pass
  finally:
    server.stop()


if __name__ == "__main__":
  main(sys.argv[1:])
