"""The Cloud Storage emulator (`gcp-storage-emulator`) with Cloud Storage's generation
preconditions, which the emulator ignores: `python -m tests.gcs_server` takes its arguments.

Tensorstore's OCDBT (orbax's checkpoint format) keeps its manifest by conditional requests: a read
with `ifGenerationNotMatch` must answer 304 when the object is unchanged, and an answer's
generation is read from the `x-goog-generation` header. The emulator answered 200 without the
header, and one save in three of the runlocal job failed with tensorstore's "Malformed
StorageGeneration". Here a download carries its generation, and `ifGenerationMatch` /
`ifGenerationNotMatch` are honoured on downloads (304 / 412) and `ifGenerationMatch` on uploads
(412), as Cloud Storage does (cloud.google.com/storage/docs/request-preconditions).
"""

import sys
from http import HTTPStatus

from gcp_storage_emulator import __main__ as emulator_main, server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


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


_plain_download, _plain_insert = objects.download, objects.insert
objects.download = _download  # (objects.get calls it by this name for alt=media)
swap = {_plain_download: _download, _plain_insert: _insert}
server.HANDLERS = tuple(
    (regex, {method: swap.get(fn, fn) for method, fn in handlers.items()})
    for regex, handlers in server.HANDLERS
)

if __name__ == "__main__":
  emulator_main.main(sys.argv[1:])
