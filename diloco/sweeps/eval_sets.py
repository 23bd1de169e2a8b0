"""A study's rows side by side only when every run scored the same evaluation set."""

from collections.abc import Iterable
from typing import Any


def summary_set(summary: dict[str, Any]) -> str | None:
  """The sha256 of the records a summary's eval_* scored (None: a summary from before it was
  recorded)."""
  return (summary.get("data") or {}).get("final_eval_sha256")


def same(rows: Iterable[dict[str, Any]], what: str = "table") -> list[dict[str, Any]]:
  """The rows, or a ValueError naming the runs of each evaluation set when the finished ones
  (`status` done, or no status) were scored on different sets (their `eval_set`; rows from before
  it was recorded have none and match only each other)."""
  rows = list(rows)
  groups: dict[Any, list[str]] = {}
  for r in rows:
    if r.get("status", "done") == "done":
      groups.setdefault(r.get("eval_set"), []).append(str(r.get("name", r.get("mode", "?"))))
  if len(groups) > 1:
    listed = "; ".join(
        f"{(s or 'not recorded')[:12]}: {', '.join(names[:3])}{' ...' * (len(names) > 3)}"
        for s, names in groups.items()
    )
    raise ValueError(
        f"the {what} would compare runs scored on different evaluation sets ({listed}); "
        "rerun them with one data config"
    )
  return rows
