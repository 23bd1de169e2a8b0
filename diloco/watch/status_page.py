"""The status service's two views of a synchronizer snapshot (diloco/rpc/status_board.py).

`metrics_text` is the Prometheus text exposition, written by prometheus-client from a collector
over one snapshot (so Grafana and alerting read it without glue); `html` is a page for people that
reloads itself every few seconds: the run at a glance, one row per learner and per fragment, and
two small plots drawn as inline SVG (merges and each learner's loss against the synchronizer's
time). It runs no script, so it works wherever the page itself loads.
"""

import html as html_lib
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

REFRESH_S = 2
PALETTE = ("#2b7bba", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")


class _Collector:
  """A prometheus-client collector of one snapshot."""

  def __init__(self, snapshot: dict[str, Any]):
    self.s = snapshot

  def collect(self):
    s = self.s
    yield GaugeMetricFamily("diloco_sync_generation", "Synchronizer generation.", s["generation"])
    yield GaugeMetricFamily("diloco_sync_uptime_seconds", "Process uptime.", s["uptime_s"])
    yield CounterMetricFamily("diloco_sync_merges", "Merges committed.", s["merges"])
    yield GaugeMetricFamily(
        "diloco_sync_merges_per_second", "Merges per second, last minute.", s["merges_per_s"]
    )
    refusals = CounterMetricFamily(
        "diloco_sync_refusals", "Refused calls by code.", labels=["code"]
    )
    for code, n in s["refusals"].items():
      refusals.add_metric([code], n)
    yield refusals
    yield from self._learners()
    version = GaugeMetricFamily("diloco_fragment_version", "Global version.", labels=["fragment"])
    last = GaugeMetricFamily(
        "diloco_fragment_last_merge_time_seconds",
        "Synchronizer time of the fragment's last merge.",
        labels=["fragment"],
    )
    for f in s["fragments"]:
      version.add_metric([str(f["fragment"])], f["version"])
      if f["last_merge_s"] is not None:
        last.add_metric([str(f["fragment"])], f["last_merge_s"])
    yield version
    yield last

  def _learners(self):
    gauges = {
        "live": GaugeMetricFamily("diloco_learner_live", "1 if live.", labels=["learner"]),
        "step": GaugeMetricFamily("diloco_learner_step", "Inner steps.", labels=["learner"]),
        "loss": GaugeMetricFamily("diloco_learner_loss", "Last logged loss.", labels=["learner"]),
        "staleness": GaugeMetricFamily(
            "diloco_learner_staleness", "Staleness of its last merged upload.", labels=["learner"]
        ),
        "last_progress_s": GaugeMetricFamily(
            "diloco_learner_seconds_since_progress",
            "Since its last heartbeat or merge.",
            labels=["learner"],
        ),
        "last_seen_s": GaugeMetricFamily(
            "diloco_learner_seconds_since_seen", "Since any call of it arrived.", labels=["learner"]
        ),
        "absent_s": GaugeMetricFamily(
            "diloco_learner_absent_seconds",
            "Since it was declared absent (only while it is).",
            labels=["learner"],
        ),
        "merged_share": GaugeMetricFamily(
            "diloco_learner_merged_share",
            "Share of its trained steps whose progress reached a merge.",
            labels=["learner"],
        ),
    }
    counters = {
        "tokens": CounterMetricFamily("diloco_learner_tokens", "Tokens.", labels=["learner"]),
        "bytes_up": CounterMetricFamily(
            "diloco_learner_received_bytes", "Wire bytes from it.", labels=["learner"]
        ),
        "bytes_down": CounterMetricFamily(
            "diloco_learner_sent_bytes", "Wire bytes to it.", labels=["learner"]
        ),
    }
    for row in self.s["learners"]:
      for key, family in {**gauges, **counters}.items():
        value = row.get(key)
        if value is not None:
          family.add_metric([str(row["learner"])], float(value))
    yield from gauges.values()
    yield from counters.values()


class _ShardLabel:
  """Every sample of `inner` with the label shard="s" (a synchronizer shard's process)."""

  def __init__(self, inner, shard: int):
    self.inner, self.shard = inner, str(shard)

  def collect(self):
    for family in self.inner.collect():
      family.samples = [
          sample._replace(labels={**sample.labels, "shard": self.shard})
          for sample in family.samples
      ]
      yield family


def metrics_text(snapshot: dict[str, Any]) -> bytes:
  """The snapshot in the Prometheus text format (version 0.0.4); a shard's samples are labelled
  with its shard."""
  registry = CollectorRegistry(auto_describe=False)
  collector = _Collector(snapshot)
  shard = snapshot.get("shard")
  registry.register(collector if shard is None else _ShardLabel(collector, shard))
  return generate_latest(registry)


def _fmt(value, digits: int = 3) -> str:
  if value is None:
    return "–"
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


def _svg(series: dict[str, list[tuple[float, float]]], title: str, width=460, height=170) -> str:
  """A line plot of named (x, y) series as inline SVG (axes with their ranges, one colour each)."""
  points = [p for pts in series.values() for p in pts]
  parts = [
      f'<svg class="plot" width="{width}" height="{height}" role="img" '
      f'aria-label="{html_lib.escape(title)}">',
      f'<text x="8" y="14" class="t">{html_lib.escape(title)}</text>',
  ]
  if points:
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    sx = (width - 60) / ((x1 - x0) or 1.0)
    sy = (height - 45) / ((y1 - y0) or 1.0)
    at = lambda x, y: (50 + (x - x0) * sx, height - 25 - (y - y0) * sy)
    parts.append(f'<rect x="50" y="20" width="{width - 60}" height="{height - 45}" class="ax"/>')
    for label, y in ((y1, 26), (y0, height - 25)):
      parts.append(f'<text x="46" y="{y}" class="n" text-anchor="end">{label:.3g}</text>')
    parts.append(f'<text x="50" y="{height - 10}" class="n">{x0:.0f} s</text>')
    parts.append(
        f'<text x="{width - 10}" y="{height - 10}" class="n" text-anchor="end">{x1:.0f} s</text>'
    )
    for i, (name, pts) in enumerate(series.items()):
      color = PALETTE[i % len(PALETTE)]
      path = " ".join(f"{a:.1f},{b:.1f}" for a, b in (at(x, y) for x, y in pts))
      parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
      parts.append(
          f'<text x="{60 + 70 * i}" y="34" class="n" style="fill:{color}">{html_lib.escape(name)}</text>'
      )
  else:
    parts.append(f'<text x="50" y="{height / 2}" class="n">nothing yet</text>')
  parts.append("</svg>")
  return "".join(parts)


def _table(headers: list[str], rows: list[list[Any]], css: list[str]) -> str:
  """An HTML table; row i gets the class css[i]."""
  head = "".join(f"<th>{html_lib.escape(h)}</th>" for h in headers)
  body = "".join(
      f'<tr class="{c}">' + "".join(f"<td>{html_lib.escape(_fmt(v))}</td>" for v in r) + "</tr>"
      for r, c in zip(rows, css)
  )
  return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em} .kv span{margin-right:1.4em}
table{border-collapse:collapse;margin:.6em 0 1em} td,th{padding:2px 10px;text-align:right}
th{border-bottom:1px solid #999} tr.absent td{color:#b00} .plot{margin-right:1em}
.t{font-size:12px;font-weight:600} .n{font-size:10px;fill:#555} .ax{fill:none;stroke:#ccc}
"""


def _state(row: dict[str, Any]) -> str:
  """live, or absent with how long (a partitioned or frozen host: declared absent, not heard)."""
  if row["live"]:
    return "live"
  return "absent" if row.get("absent_s") is None else f"absent {row['absent_s']:.0f} s"


def html(snapshot: dict[str, Any]) -> str:
  """The page for people: the run at a glance, learners, fragments, plots; reloads itself."""
  s = snapshot
  learners = [
      [
          r["learner"],
          _state(r),
          "yes" if r["finished"] else "no",
          r["step"],
          r["tokens"],
          r["loss"],
          r["staleness"],
          r.get("merged_share"),
          r["last_progress_s"],
          r.get("last_seen_s"),
          " ".join(map(str, r["versions"])),
          r["bytes_up"],
          r["bytes_down"],
      ]
      for r in s["learners"]
  ]
  learner_rows = _table(
      ["learner", "state", "finished", "step", "tokens", "loss", "staleness", "merged share",
       "progress s ago", "seen s ago", "versions held", "bytes up", "bytes down"],
      learners,
      css=["learner" if r["live"] else "learner absent" for r in s["learners"]],
  )  # fmt: skip
  fragments = _table(
      ["fragment", "version", "last merge s", "recent quorums", "recent grace s"],
      [
          [
              f["fragment"],
              f["version"],
              f["last_merge_s"],
              " ".join(str(r["quorum"]) for r in f["recent"]),
              " ".join(f"{r['grace_s']:.2f}" for r in f["recent"]),
          ]
          for f in s["fragments"]
      ],
      css=["fragment"] * len(s["fragments"]),
  )
  merges = {"merges": [(t, n) for t, n in s["history"]["merges"]]}
  loss = {f"L{m}": [(t, x) for t, _, x in c] for m, c in s["history"]["loss"].items()}
  refusals = ", ".join(f"{k} {n}" for k, n in s["refusals"].items()) or "none"
  glance = (
      f'<div class="kv"><span>generation <b>{s["generation"]}</b></span>'
      f'<span>up <b>{s["uptime_s"]:.0f} s</b></span><span>merges <b>{s["merges"]}</b></span>'
      f'<span><b>{s["merges_per_s"]:.2f}</b> merges/s</span>'
      f'<span>live learners <b>{sum(r["live"] for r in s["learners"])}</b> of '
      f'{len(s["learners"])}</span><span>refusals: {html_lib.escape(refusals)}</span></div>'
  )
  name = "synchronizer" if s.get("shard") is None else f"synchronizer shard {s['shard']}"
  return (
      f'<!doctype html><html><head><meta charset="utf-8">'
      f'<meta http-equiv="refresh" content="{REFRESH_S}"><title>DiLoCo {name}</title>'
      f"<style>{_STYLE}</style></head><body><h1>DiLoCo {name}</h1>{glance}"
      f'<div>{_svg(merges, "merges")}{_svg(loss, "learner loss")}</div>'
      f"<h2>Learners</h2>{learner_rows}<h2>Fragments</h2>{fragments}"
      f"</body></html>"
  )
