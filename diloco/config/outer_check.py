"""Checks of the `outer` section across its keys that must fail before a run starts, naming the
key (each key's own domain is declared with it: diloco/config/domains.py)."""

import ml_collections

from diloco.outer import learner as learner_lib


def check(outer: ml_collections.ConfigDict) -> None:
  """ValueError naming the first bad combination of `outer` keys (delivery, anchor, the restart
  window, restarts of the inner optimizer, DyLU)."""
  broadcast = outer.get("broadcast", "all")
  delivery = outer.get("delivery", "replace")
  if delivery == "rebase" and outer.alpha > 0:
    raise ValueError(
        f"outer.delivery=rebase with outer.alpha={outer.alpha}: rebase keeps all of the "
        "learner's progress the merge lacks, so there is nothing left to mix; alpha is for "
        "replace and at_own_sync"
    )
  anchor = outer.get("anchor", "base")
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
  if window > 0 and (broadcast != "contributors" or not outer.blocking):
    raise ValueError(
        f"outer.restart_window_s={window} holds back a merge's contributors, so it needs "
        f"outer.broadcast='contributors' and blocking learners (got {broadcast!r}, "
        f"blocking={outer.blocking})"
    )
  if outer.get("merge_scale", "one") == "tokens" and outer.optimizer == "delayed_nesterov":
    raise ValueError(
        "outer.merge_scale=tokens with outer.optimizer=delayed_nesterov: a merge's share of an "
        "outer step is a fractional Nesterov or SGD step; delayed Nesterov already spreads its "
        "momentum over outer.delayed_period merges (use merge_scale=one)"
    )
  if outer.get("merge_clock", "arrival") == "period" and outer.blocking:
    raise ValueError(
        "outer.merge_clock=period with blocking learners: a blocking learner waits for the merge "
        "of its upload, which the period clock holds until the fragment's scheduled time; the "
        "period clock is for Decoupled learners (outer.blocking=False)"
    )
  schedule_by = outer.get("schedule_by", "own")
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
