"""Wire form of the protocol messages (Join, Leave, Upload, Send, ...) and chunked byte streams.

A message becomes: an 8-byte magic and header length, a JSON header, then the raw tensor payloads
back to back. The header names the message type and carries every dataclass field generically,
field by field: numbers, strings and tuples as JSON; path-keyed dicts of `compression.Encoded` or
of arrays as tensor records (codec or dtype, shape, block, byte count) whose bytes follow. Fields
added to a protocol dataclass later travel without changes here, as long as they are one of those
kinds. `decode_message` trusts nothing: every size, dtype, codec and field name is checked, and a
malformed message raises `WireError` (a ValueError) naming the problem.

`split` cuts a serialized message into chunks (index, total, length, CRC-32 of each chunk) of at
most `max_chunk` bytes; `Reassembler` puts them back and rejects a stream that is out of order,
duplicated, truncated, inconsistent, corrupted or over its size limit.
"""

import dataclasses
import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from diloco.outer import outcomes, protocol
from diloco.outer.codecs import compression

MAGIC = b"DLW1"
_HEAD = struct.Struct("<4sI")
MESSAGES: dict[str, type] = {
    c.__name__: c
    for c in (
        protocol.Join,
        protocol.Leave,
        protocol.Upload,
        protocol.Send,
        protocol.Tick,
        protocol.Refused,  # a refusal at merge time, to the learner's poll
    )
}
# Array dtypes that may travel as full values (fp32 fragments) on the wire.
_DTYPES = ("<f4",)


class WireError(ValueError):
  """Bytes from the wire that do not form a valid message or chunk stream; `code` names why."""

  def __init__(self, code: str, message: str):
    super().__init__(message)
    self.code = code


def _is_tensor_map(value: Any) -> bool:
  return isinstance(value, Mapping) and all(
      isinstance(v, (compression.Encoded, np.ndarray)) for v in value.values()
  )


def encode_message(msg: Any) -> bytes:
  """Serializes a protocol dataclass (generically, field by field)."""
  name = type(msg).__name__
  if MESSAGES.get(name) is not type(msg):
    raise ValueError(f"cannot serialize {type(msg)!r}: not a protocol message")
  fields: dict[str, Any] = {}
  tensors: list[dict] = []
  blobs: list[bytes] = []
  for f in dataclasses.fields(msg):
    value = getattr(msg, f.name)
    if isinstance(value, outcomes.Code):
      value = value.value
    if value is None or not isinstance(value, Mapping):
      fields[f.name] = list(value) if isinstance(value, tuple) else value
      continue
    if not _is_tensor_map(value):
      raise ValueError(f"field {f.name} holds a mapping that is not a tensor dict")
    fields[f.name] = {"tensors": len(value)}
    for path in sorted(value):
      x = value[path]
      if isinstance(x, compression.Encoded):
        tensors.append(
            {
                "field": f.name,
                "path": path,
                "codec": x.codec,
                "shape": list(x.shape),
                "block": x.block,
                "nbytes": x.nbytes,
            }
        )
        blobs.append(x.payload)
      else:
        a = np.ascontiguousarray(x, np.float32)
        tensors.append(
            {
                "field": f.name,
                "path": path,
                "dtype": "<f4",
                "shape": list(a.shape),
                "nbytes": a.nbytes,
            }
        )
        blobs.append(a.tobytes())
  header = json.dumps({"type": name, "fields": fields, "tensors": tensors}).encode()
  return b"".join([_HEAD.pack(MAGIC, len(header)), header, *blobs])


def decode_message(data: bytes, max_bytes: int | None = None) -> Any:
  """Parses `encode_message` output back into its dataclass; WireError on anything malformed."""
  if max_bytes is not None and len(data) > max_bytes:
    raise WireError("too_large", f"message of {len(data)} bytes exceeds the {max_bytes} limit")
  if len(data) < _HEAD.size:
    raise WireError("malformed", f"message of {len(data)} bytes is shorter than its header")
  magic, hlen = _HEAD.unpack_from(data)
  if magic != MAGIC:
    raise WireError("malformed", f"bad magic {magic!r}, expected {MAGIC!r}")
  if _HEAD.size + hlen > len(data):
    raise WireError("malformed", f"header of {hlen} bytes runs past the message end")
  try:
    header = json.loads(data[_HEAD.size : _HEAD.size + hlen])
    name, fields, tensors = header["type"], dict(header["fields"]), list(header["tensors"])
  except (ValueError, KeyError, TypeError) as err:
    raise WireError("malformed", f"unreadable message header: {err}") from err
  cls = MESSAGES.get(name) if isinstance(name, str) else None
  if cls is None:
    raise WireError("malformed", f"unknown message type {name!r}")
  known = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise WireError("malformed", f"{name} has no fields {unknown}")
  maps: dict[str, dict] = {k: {} for k, v in fields.items() if isinstance(v, dict)}
  offset = _HEAD.size + hlen
  for t in tensors:
    offset = _read_tensor(t, data, offset, maps)
  if offset != len(data):
    raise WireError("malformed", f"{len(data) - offset} trailing bytes after the tensors")
  kwargs: dict[str, Any] = {}
  for k, v in fields.items():
    if isinstance(v, dict):
      if len(maps[k]) != v.get("tensors"):
        raise WireError(
            "malformed", f"field {k}: {len(maps[k])} tensors, header says {v.get('tensors')}"
        )
      kwargs[k] = maps[k]
    else:
      kwargs[k] = tuple(v) if isinstance(v, list) else v
  if cls is protocol.Refused:
    code = outcomes.find(str(kwargs.get("code")))
    if code is None:
      raise WireError("malformed", f"Refused with an unknown code {kwargs.get('code')!r}")
    kwargs["code"] = code
  try:
    return cls(**kwargs)
  except (TypeError, ValueError) as err:
    raise WireError("malformed", f"invalid {name}: {err}") from err


def _read_tensor(t: Any, data: bytes, offset: int, maps: dict[str, dict]) -> int:
  """Reads one tensor record's payload into `maps`; returns the offset after it."""
  try:
    field, path, shape, nbytes = t["field"], str(t["path"]), tuple(t["shape"]), t["nbytes"]
    shape = tuple(int(d) for d in shape)
  except (KeyError, TypeError, ValueError) as err:
    raise WireError("malformed", f"bad tensor record {t!r}") from err
  if field not in maps:
    raise WireError("malformed", f"tensor for field {field!r}, which is not a tensor field")
  if path in maps[field]:
    raise WireError("malformed", f"tensor {path} sent twice")
  if not isinstance(nbytes, int) or nbytes < 0 or offset + nbytes > len(data):
    raise WireError("malformed", f"tensor {path}: {nbytes} bytes run past the message end")
  if any(d < 0 for d in shape):
    raise WireError("shape", f"tensor {path} has a negative dimension {shape}")
  payload = data[offset : offset + nbytes]
  if "codec" in t:
    try:
      e = compression.Encoded(t["codec"], shape, bytes(payload), int(t["block"]))
    except (ValueError, KeyError, TypeError) as err:
      raise WireError("dtype", f"tensor {path}: {err}") from err
    if e.nbytes != compression.encoded_nbytes(e.codec, e.num_values, e.block):
      raise WireError(
          "shape", f"tensor {path}: {e.nbytes} bytes do not hold shape {shape} in {e.codec}"
      )
    maps[field][path] = e
  else:
    if t.get("dtype") not in _DTYPES:
      raise WireError(
          "dtype",
          f"tensor {path} has dtype {t.get('dtype')!r}; only {_DTYPES} travel as values",
      )
    if nbytes != 4 * int(np.prod(shape, dtype=np.int64)):
      raise WireError("shape", f"tensor {path}: {nbytes} bytes do not hold float32 {shape}")
    maps[field][path] = np.frombuffer(payload, "<f4").reshape(shape).copy()
  return offset + nbytes


@dataclasses.dataclass(frozen=True)
class Piece:
  """One chunk of a serialized message."""

  index: int
  total: int
  length: int  # of the whole message
  crc: int  # CRC-32 of `data`
  data: bytes


def split(data: bytes, max_chunk: int) -> list[Piece]:
  """Cuts `data` into pieces of at most `max_chunk` bytes (at least one piece)."""
  if max_chunk < 1:
    raise ValueError(f"max_chunk must be >= 1, got {max_chunk}")
  parts = [data[i : i + max_chunk] for i in range(0, len(data), max_chunk)] or [b""]
  return [Piece(i, len(parts), len(data), zlib.crc32(p), p) for i, p in enumerate(parts)]


class Reassembler:
  """Joins pieces that must arrive in order, each once, into one message of bounded size."""

  def __init__(self, max_bytes: int, max_chunks: int):
    self.max_bytes, self.max_chunks = max_bytes, max_chunks
    self._parts: list[bytes] = []
    self._total = self._length = None
    self._size = 0

  def add(self, piece: Piece) -> None:
    """Takes the next piece; WireError if it does not continue the stream correctly."""
    if self._total is None:
      if not 1 <= piece.total <= self.max_chunks:
        raise WireError(
            "too_many_chunks", f"stream of {piece.total} chunks; the limit is {self.max_chunks}"
        )
      if piece.length > self.max_bytes:
        raise WireError(
            "too_large", f"message of {piece.length} bytes exceeds the {self.max_bytes} limit"
        )
      self._total, self._length = piece.total, piece.length
    if (piece.total, piece.length) != (self._total, self._length):
      raise WireError(
          "inconsistent",
          f"chunk {piece.index} says {piece.total} chunks of "
          f"{piece.length} bytes, the stream said {self._total} of {self._length}",
      )
    expected = len(self._parts)
    if piece.index < expected:
      raise WireError("duplicate_chunk", f"chunk {piece.index} arrived twice")
    if piece.index != expected:
      raise WireError("out_of_order", f"chunk {piece.index} arrived, expected {expected}")
    if piece.index >= self._total:
      raise WireError("too_many_chunks", f"chunk {piece.index} beyond total {self._total}")
    if zlib.crc32(piece.data) != piece.crc:
      raise WireError("checksum", f"chunk {piece.index} fails its CRC-32")
    self._size += len(piece.data)
    if self._size > self._length:
      raise WireError("too_large", f"chunks carry more than the announced {self._length} bytes")
    self._parts.append(piece.data)

  def done(self) -> bytes:
    """The whole message; WireError if the stream ended early."""
    if self._total is None:
      raise WireError("truncated", "empty chunk stream")
    if len(self._parts) != self._total or self._size != self._length:
      raise WireError(
          "truncated",
          f"stream ended after {len(self._parts)} of {self._total}"
          f" chunks ({self._size} of {self._length} bytes)",
      )
    return b"".join(self._parts)
