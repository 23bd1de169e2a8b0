"""Shared-secret tokens (gRPC metadata, HTTP bearer headers) and TLS credentials of the
synchronizer's services."""

import hmac

import grpc

TOKEN_KEY = "x-diloco-token"


def _same(got, token: str) -> bool:
  """Whether `got` is the string `token` (compared in constant time)."""
  return isinstance(got, str) and hmac.compare_digest(got.encode(), token.encode())


def token_ok(metadata, token: str) -> bool:
  """Whether the call's metadata carries `token`."""
  return _same(dict(metadata or ()).get(TOKEN_KEY, ""), token)


def bearer_ok(header: str | None, token: str) -> bool:
  """Whether an HTTP Authorization header is exactly `Bearer <token>` (the status service)."""
  prefix = "Bearer "
  return bool(header) and header.startswith(prefix) and _same(header[len(prefix) :], token)


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def server_credentials(cert: str, key: str) -> grpc.ServerCredentials | None:
  """TLS for the server when both files are given, else None (plaintext on loopback)."""
  if bool(cert) != bool(key):
    raise ValueError("TLS needs both a certificate and a key (got only one)")
  if not cert:
    return None
  return grpc.ssl_server_credentials([(_read(key), _read(cert))])


def channel_credentials(ca_cert: str) -> grpc.ChannelCredentials | None:
  """TLS for a client that trusts `ca_cert` (the self-signed certificate itself), else None."""
  return grpc.ssl_channel_credentials(root_certificates=_read(ca_cert)) if ca_cert else None
