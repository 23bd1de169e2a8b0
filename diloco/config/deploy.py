"""The `deploy` config section: how the threads and gRPC runtimes are run and secured.

Call `add_deploy_section(c)` in a config's get_config before `c.lock()`.
"""

import ml_collections

RUNTIMES = ("virtual", "threads", "grpc")


def add_deploy_section(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds c.deploy with the defaults below (loopback, no TLS, token from $DILOCO_TOKEN)."""
  c.deploy = ml_collections.ConfigDict(
      dict(
          runtime="virtual",  # virtual | threads | grpc
          bind="127.0.0.1",  # the synchronizer binds loopback unless told otherwise
          port=0,  # 0: a free port, written to WORKDIR/port
          status_port=-1,  # the status page, /status, /metrics (0: a free port, in
          # WORKDIR/status_port; -1: off); bound like the gRPC port, the same token
          cert="",
          key="",
          ca_cert="",  # TLS when set (scripts/make_certs.py makes a local pair)
          absent_after_s=5.0,  # a learner silent this long is left out of quorums until it rejoins
          chaos_time_scale=1.0,  # threads and gRPC: wall seconds per second of the chaos schedule
          straggle_busy=False,  # gRPC learners: a straggling step spins on a core instead of sleeping
          devices_per_learner=0,  # threads runtime: local devices per learner; 0 = split evenly
          max_learners=64,
          chunk_bytes=1 << 20,
          max_message_bytes=4 << 20,
          tpu=ml_collections.ConfigDict(
              dict(  # scripts/tpu/commands.py
                  project="",
                  zone="us-central2-b",
                  accelerator_type="v4-8",
                  runtime_version="tpu-ubuntu2204-base",
                  name_prefix="diloco",
                  sync_host="",
                  repo_dir="~/diloco",
              )
          ),
      )
  )
  return c


def check(deploy: ml_collections.ConfigDict) -> None:
  """ValueError naming the first bad setting."""
  if deploy.runtime not in RUNTIMES:
    raise ValueError(f"deploy.runtime must be one of {RUNTIMES}, got {deploy.runtime!r}")
  if bool(deploy.cert) != bool(deploy.key):
    raise ValueError("deploy.cert and deploy.key go together")
  if not 0 <= deploy.port < 65536:
    raise ValueError(f"deploy.port out of range: {deploy.port}")
  if not -1 <= deploy.status_port < 65536:
    raise ValueError(
        f"deploy.status_port must be -1 (off), 0 (a free port) or a port, got "
        f"{deploy.status_port}"
    )
  if deploy.status_port > 0 and deploy.status_port == deploy.port:
    raise ValueError(f"deploy.status_port and deploy.port are both {deploy.port}")
  if not deploy.bind:
    raise ValueError("deploy.bind is empty (127.0.0.1 for loopback, or an address to listen on)")
  if deploy.absent_after_s <= 0:
    raise ValueError(f"deploy.absent_after_s must be > 0, got {deploy.absent_after_s}")
  if deploy.devices_per_learner < 0:
    raise ValueError(f"deploy.devices_per_learner must be >= 0, got {deploy.devices_per_learner}")
  if deploy.chaos_time_scale <= 0:
    raise ValueError(f"deploy.chaos_time_scale must be > 0, got {deploy.chaos_time_scale}")
  for name in ("max_learners", "chunk_bytes", "max_message_bytes"):
    if deploy[name] < 1:
      raise ValueError(f"deploy.{name} must be >= 1, got {deploy[name]}")
  if deploy.chunk_bytes + 1024 > deploy.max_message_bytes:
    raise ValueError(
        f"deploy.chunk_bytes={deploy.chunk_bytes} leaves no room for the chunk header "
        f"under deploy.max_message_bytes={deploy.max_message_bytes}"
    )
