"""Makes a self-signed TLS certificate and key for local use (openssl; no other dependency).

  python scripts/make_certs.py --out=certs [--host=localhost]

Writes OUT/cert.pem and OUT/key.pem, valid for `host` and 127.0.0.1. Give the synchronizer
--cert=OUT/cert.pem --key=OUT/key.pem and each learner --ca_cert=OUT/cert.pem.
"""

import argparse
import os
import subprocess


def make_self_signed(out: str, host: str = "localhost", days: int = 30) -> tuple[str, str]:
  """Writes a self-signed pair into `out`; returns (cert path, key path)."""
  os.makedirs(out, exist_ok=True)
  cert, key = os.path.join(out, "cert.pem"), os.path.join(out, "key.pem")
  subprocess.run(
      [
          "openssl",
          "req",
          "-x509",
          "-newkey",
          "rsa:2048",
          "-nodes",
          "-sha256",
          "-keyout",
          key,
          "-out",
          cert,
          "-days",
          str(days),
          "-subj",
          f"/CN={host}",
          "-addext",
          f"subjectAltName=DNS:{host},IP:127.0.0.1",
      ],
      check=True,
      capture_output=True,
      timeout=60,
  )
  os.chmod(key, 0o600)
  return cert, key


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--host", default="localhost")
  args = ap.parse_args()
  print(*make_self_signed(args.out, args.host))


if __name__ == "__main__":
  main()
