"""Where a process reads the shared token from, so that it never sits on a command line.

A reference is `env:NAME` (an environment variable), `file:PATH` (a file only its owner can read,
as ssh insists for keys) or `k8s:NAMESPACE/SECRET/KEY` (a Kubernetes secret, read through the
cluster's API with the pod's service account: the account needs `get` on that secret).
"""

import base64
import json
import os
import ssl
import stat
import urllib.request

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def read(ref: str, *, api: str = "", account_dir: str = SERVICE_ACCOUNT) -> str:
  """The token `ref` names (see the module doc); ValueError saying what is wrong."""
  kind, _, where = ref.partition(":")
  if kind == "env":
    token = os.environ.get(where, "")
  elif kind == "file":
    token = _from_file(os.path.expanduser(where))
  elif kind == "k8s":
    token = _from_secret(where, api, account_dir)
  else:
    raise ValueError(f"token reference {ref!r}: expected env:NAME, file:PATH or k8s:NS/SECRET/KEY")
  token = token.strip()
  if not token:
    raise ValueError(f"token reference {ref!r} gave an empty token")
  return token


def write(path: str, token: str) -> str:
  """Writes `token` to `path` readable by its owner only (mode 600, created so from the start)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if os.path.exists(path):
    os.chmod(path, 0o600)
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  with os.fdopen(fd, "w") as f:
    f.write(token)
  return path


def _from_file(path: str) -> str:
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError as err:
    raise ValueError(f"token file {path} does not exist") from err
  if mode & (stat.S_IRWXG | stat.S_IRWXO):
    raise ValueError(
        f"token file {path} has mode {stat.S_IMODE(mode):o}: others can read it (chmod 600 {path})"
    )
  with open(path, encoding="utf-8") as f:
    return f.read()


def _from_secret(where: str, api: str, account_dir: str) -> str:
  parts = where.split("/")
  if len(parts) != 3 or not all(parts):
    raise ValueError(f"k8s token reference {where!r}: expected NAMESPACE/SECRET/KEY")
  namespace, name, key = parts
  if not api:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
      raise ValueError("k8s token reference outside a Kubernetes pod (no KUBERNETES_SERVICE_HOST)")
    api = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
  with open(os.path.join(account_dir, "token"), encoding="utf-8") as f:
    bearer = f.read().strip()
  request = urllib.request.Request(
      f"{api}/api/v1/namespaces/{namespace}/secrets/{name}",
      headers={"Authorization": f"Bearer {bearer}", "Accept": "application/json"},
  )
  context = None
  if api.startswith("https:"):
    context = ssl.create_default_context(cafile=os.path.join(account_dir, "ca.crt"))
  with urllib.request.urlopen(request, timeout=30, context=context) as response:
    data = json.load(response).get("data", {})
  if key not in data:
    raise ValueError(f"secret {namespace}/{name} has no key {key!r} (keys: {sorted(data)})")
  return base64.b64decode(data[key]).decode("utf-8")
