"""Checks of the `outer` section that must fail before a run starts, naming the key."""

import ml_collections

from diloco.outer import compression, learner as learner_lib, policies


def check(outer: ml_collections.ConfigDict) -> None:
  """ValueError naming the first bad key of `outer` (codecs, rounding, broadcast, delivery, anchor, DyLU)."""
  for key in ("codec", "downlink_codec"):
    value = outer.get(key, "")
    if (value or key == "codec") and value not in compression.CODECS:
      raise ValueError(
          f"outer.{key}={value!r}: unknown codec; expected one of {compression.CODECS}"
      )
  rounding = outer.get("fp4_rounding", "log")
  if rounding not in compression.ROUNDINGS:
    raise ValueError(
        f"outer.fp4_rounding={rounding!r}: unknown rounding; expected one of {compression.ROUNDINGS}"
    )
  broadcast = outer.get("broadcast", "all")
  if broadcast not in policies.BROADCASTS:
    raise ValueError(f"outer.broadcast={broadcast!r}: expected one of {policies.BROADCASTS}")
  delivery = outer.get("delivery", "replace")
  if delivery not in learner_lib.DELIVERIES:
    raise ValueError(f"outer.delivery={delivery!r}: expected one of {learner_lib.DELIVERIES}")
  if delivery == "rebase" and outer.alpha > 0:
    raise ValueError(
        f"outer.delivery=rebase with outer.alpha={outer.alpha}: rebase keeps all of the "
        "learner's progress the merge lacks, so there is nothing left to mix; alpha is for "
        "replace and at_own_sync"
    )
  anchor = outer.get("anchor", "base")
  if anchor not in policies.ANCHORS:
    raise ValueError(f"outer.anchor={anchor!r}: expected one of {policies.ANCHORS}")
  if anchor == "global":
    if delivery == "rebase":
      raise ValueError(
          "outer.anchor=global with outer.delivery=rebase: " + learner_lib.GLOBAL_REBASE
      )
    if outer.codec not in learner_lib.GLOBAL_CODECS or outer.get("error_feedback", False):
      raise ValueError(
          f"outer.anchor=global with outer.codec={outer.codec!r}"
          f"{' and error feedback' if outer.get('error_feedback', False) else ''}: under the "
          "global anchor the learners send their fragment's values, which a low-bit codec "
          f"would ruin; use outer.codec in {learner_lib.GLOBAL_CODECS} without error feedback"
      )
  window = outer.get("restart_window_s", 0.0)
  if window < 0:
    raise ValueError(f"outer.restart_window_s must be >= 0, got {window}")
  if window > 0 and (broadcast != "contributors" or not outer.blocking):
    raise ValueError(
        f"outer.restart_window_s={window} holds back a merge's contributors, so it needs "
        f"outer.broadcast='contributors' and blocking learners (got {broadcast!r}, "
        f"blocking={outer.blocking})"
    )
  schedule_by = outer.get("schedule_by", "own")
  if schedule_by not in ("own", "global"):
    raise ValueError(f"outer.schedule_by={schedule_by!r}: expected own or global")
  restarts = outer.get("fresh_inner_optimizer", False) or schedule_by == "global"
  if restarts and outer.fragments != 1:
    raise ValueError(
        f"outer.fresh_inner_optimizer / outer.schedule_by=global restart the inner optimizer "
        f"when the whole model comes back: they need outer.fragments=1, got {outer.fragments}"
    )
  if outer.get("dylu", False):
    if outer.inner_steps < 1:
      raise ValueError(f"outer.dylu needs outer.inner_steps >= 1, got {outer.inner_steps}")
    if outer.quorum == 0 and outer.blocking:
      raise ValueError(
          "outer.dylu with outer.quorum=0 and blocking learners: every merge waits for every "
          "learner, so the fast ones would idle through the slow ones' shorter rounds; DyLU is "
          "for asynchronous runs (outer.quorum >= 1)"
      )
