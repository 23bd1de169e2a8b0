"""What a remote host receives: the code a learner needs, packed, and the token in a mode-600 file.

The pack holds `SHIPPED` only (no virtual environments, run directories, caches, notebooks or
tests), so copying it to every worker of every slice sends a few hundred kilobytes. The token is
written by the launcher itself, never passed as an argument; the remote side moves it beside the
code with mode 600 and processes read it with --token_from=file:PATH.
"""

import dataclasses
import os
import shlex
import tempfile

from diloco.launch import tokens

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = ("setup.py", "pyproject.toml", "diloco", "experiments", "configs")
EXCLUDED = ("__pycache__", "*.pyc", "*.egg-info", ".venv", "runs", ".pytest_cache")
PYTHON = "python3.11"  # the package needs 3.11; TPU VM images (Ubuntu 22.04) ship 3.10
CODE, TOKEN = "diloco.tgz", "diloco_token"


@dataclasses.dataclass(frozen=True)
class Stage:
  """The local directory holding the pack and the token file."""

  dir: str = os.path.join(tempfile.gettempdir(), "diloco-stage")

  @property
  def code(self) -> str:
    return os.path.join(self.dir, CODE)

  @property
  def token(self) -> str:
    return os.path.join(self.dir, TOKEN)

  def write_token(self, token: str) -> str:
    os.makedirs(self.dir, mode=0o700, exist_ok=True)
    return tokens.write(self.token, token)


def pack(stage: Stage, repo: str = REPO) -> list[str]:
  """The command that packs SHIPPED from `repo` into stage.code (readable by its owner only)."""
  excludes = " ".join(f"--exclude={shlex.quote(e)}" for e in EXCLUDED)
  return [
      "bash",
      "-c",
      f"umask 077 && mkdir -p {shlex.quote(stage.dir)} && tar -czf {shlex.quote(stage.code)} "
      f"{excludes} -C {shlex.quote(repo)} {' '.join(SHIPPED)}",
  ]


def unpack(repo_dir: str, extra: str = "") -> str:
  """Remote shell: unpack ~/diloco.tgz into `repo_dir`, move the token beside it (mode 600) and
  install the package (with `extra`, e.g. tpu) into repo_dir/.venv."""
  spec = f"'.[{extra}]'" if extra else "."
  return (
      f"set -e; umask 077; sudo apt-get -qq update >/dev/null && sudo DEBIAN_FRONTEND=noninteractive "
      f"apt-get -qq install -y {PYTHON}-venv >/dev/null; mkdir -p {repo_dir} && tar -xzf ~/{CODE} "
      f"-C {repo_dir} && mv -f ~/{TOKEN} {repo_dir}/.{TOKEN} && chmod 600 {repo_dir}/.{TOKEN}; "
      f"cd {repo_dir}; [ -x .venv/bin/python ] || {PYTHON} -m venv .venv; "
      f".venv/bin/pip install -q -e {spec}"
  )


def token_flag(repo_dir: str) -> str:
  return f"--token_from=file:{repo_dir}/.{TOKEN}"


def supervised(command: str, deploy, log: str, out: str, python: str = ".venv/bin/python") -> str:
  """Shell: `command` (an experiments module and its flags) under experiments.supervise,
  detached from the ssh session, its output appended to `out`."""
  return (
      f"setsid nohup {python} -m experiments.supervise --max_restarts={deploy.max_restarts} "
      f"--backoff_s={deploy.restart_backoff_s} --log={log} -- {python} -m {command} "
      f">> {out} 2>&1 < /dev/null &"
  )
