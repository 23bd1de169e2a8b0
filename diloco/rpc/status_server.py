"""The synchronizer's status service: /status (JSON), /metrics (Prometheus text), / (a page).

It listens on `deploy.bind`:`deploy.status_port` (0: a free port, written to WORKDIR/status_port;
-1, the default: off), over TLS with the gRPC service's certificate when `deploy.cert`/`key` are
set. Every path needs the deployment's token as `Authorization: Bearer <token>`; a request without
it gets 401 and is counted among the refusals (code `unauthenticated`), and changes nothing else.
Requests are served on their own threads from a `StatusBoard` snapshot, which never takes the
synchronizer host's lock (diloco/rpc/status_board.py), rendered at most once per MAX_AGE_S per
page: readers that ask back to back share renderings instead of taking the interpreter from the
gRPC handlers (scripts/bench_status.py measures it).
"""

import http.server
import json
import ssl
import threading
import time

from diloco.rpc import security
from diloco.watch import status_page

MAX_AGE_S = 0.5  # a page is rendered again at most this often (the HTML page reloads every 2 s)
CONTENT = {
    "/status": "application/json",
    "/metrics": "text/plain; version=0.0.4; charset=utf-8",
    "/": "text/html; charset=utf-8",
}


def _render(path: str, board) -> bytes:
  snapshot = board.snapshot()
  if path == "/status":
    return json.dumps(snapshot, sort_keys=True).encode()
  if path == "/metrics":
    return status_page.metrics_text(snapshot)
  return status_page.html(snapshot).encode()


class _Cache:
  """Each page rendered at most once per `max_age_s`: however fast readers ask, the snapshots
  and their rendering (which share the interpreter with the gRPC handlers) stay bounded."""

  def __init__(self, board, max_age_s: float):
    self.board, self.max_age_s = board, max_age_s
    self._lock = threading.Lock()
    self._pages: dict[str, tuple[float, bytes]] = {}

  def get(self, path: str) -> bytes:
    with self._lock:
      made, body = self._pages.get(path, (-float("inf"), b""))
      if time.monotonic() - made >= self.max_age_s:
        body = _render(path, self.board)
        self._pages[path] = (time.monotonic(), body)
      return body


def _handler(cache: _Cache, token: str, count):
  class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "diloco-status"

    def do_GET(self):  # noqa: N802 (http.server's name)
      path = self.path.split("?", 1)[0]
      if not security.bearer_ok(self.headers.get("Authorization"), token):
        count("unauthenticated")
        return self._send(401, b"missing or wrong bearer token\n", "text/plain", bearer=True)
      if path not in CONTENT:
        return self._send(404, f"no such page: {path}\n".encode(), "text/plain")
      self._send(200, cache.get(path), CONTENT[path])

    def _send(self, code: int, body: bytes, content_type: str, bearer: bool = False) -> None:
      self.send_response(code)
      self.send_header("Content-Type", content_type)
      self.send_header("Content-Length", str(len(body)))
      self.send_header("Cache-Control", "no-store")
      if bearer:
        self.send_header("WWW-Authenticate", 'Bearer realm="diloco"')
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *args):  # requests are not logged to stderr
      pass

  return Handler


class StatusServer:
  """The status service over one board, serving in daemon threads until `close()`."""

  def __init__(
      self,
      board,
      token: str,
      *,
      bind: str,
      port: int,
      cert: str = "",
      key: str = "",
      count=None,
      max_age_s: float = MAX_AGE_S,
  ):
    if not token:
      raise ValueError("the status service needs the deployment's non-empty token")
    handler = _handler(_Cache(board, max_age_s), token, count or (lambda code: None))
    self.httpd = http.server.ThreadingHTTPServer((bind, port), handler)
    self.httpd.daemon_threads = True
    if cert:
      context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
      context.load_cert_chain(cert, key)
      self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
    self.port = self.httpd.server_address[1]
    self._thread = threading.Thread(
        target=self.httpd.serve_forever, kwargs=dict(poll_interval=0.2), daemon=True
    )
    self._thread.start()

  def close(self) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()
    self._thread.join(timeout=2.0)
