"""The timeline of a virtual-runtime run: what each learner did when, the merges, the global model.

`Trace` collects spans per learner as the runtime goes: `train` (a step computing), `wait` (a
blocking learner waiting for a fragment to come back), `down` (crashed until it rejoined). Time a
learner has no span in is time it had nothing to do (it used its share of the budget). `draw`
writes the picture: one row per learner, below them the merges (one mark per merge, at its
fragment's height) and the global model's row, advancing or stalled. The model counts as stalled
where two merges lie further apart than the nominal merge period H·step_s/P (the excess is the
stall), the definition the summary's `uptime` uses.
"""

import dataclasses
from collections.abc import Sequence

from diloco import paths

TRAIN, WAIT, DOWN = "train", "wait", "down"
COLORS = {TRAIN: "#2b7bba", WAIT: "#f0a030", DOWN: "#d62728"}
ADVANCING, STALLED = "#4daf4a", "#bbbbbb"


@dataclasses.dataclass
class Trace:
  """Spans (kind, start, end) per learner in simulated seconds; touching spans of one kind are
  joined, so a learner that trains without pause is one span."""

  learners: int
  spans: list[list[tuple[str, float, float]]] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    self.spans = self.spans or [[] for _ in range(self.learners)]

  def span(self, m: int, kind: str, start: float, end: float) -> None:
    if kind not in COLORS:
      raise ValueError(f"span kind must be one of {tuple(COLORS)}, got {kind!r}")
    if end <= start:
      return
    rows = self.spans[m]
    if rows and rows[-1][0] == kind and abs(rows[-1][2] - start) <= 1e-9 * max(1.0, start):
      rows[-1] = (kind, rows[-1][1], end)
    else:
      rows.append((kind, start, end))

  def cut(self, m: int, at: float) -> None:
    """Learner m stopped at `at` (it crashed): its spans end there."""
    self.spans[m] = [(k, s, min(e, at)) for k, s, e in self.spans[m] if s < at]

  def total(self, m: int, kind: str) -> float:
    return sum(e - s for k, s, e in self.spans[m] if k == kind)


def stalled_spans(
    merge_times: list[float], end: float, period_s: float
) -> list[tuple[float, float]]:
  """Where the global model stalled: each gap between merges (from 0 to the first, from the last
  to `end`) longer than `period_s`, less its first `period_s`."""
  times = [0.0] + sorted(merge_times) + [end]
  return [(a + period_s, b) for a, b in zip(times, times[1:]) if b - a > period_s]


def figure(
    trace: Trace,
    merges: list[dict],
    end: float,
    period_s: float,
    fragments: int,
    down: list[tuple[int, float, float]] = (),
    sync_down: list[tuple[float, float]] = (),
    title: str = "",
    shares: Sequence[float | None] = (),
):
  """The timeline as a matplotlib figure (see the module doc): returns (figure, rows axes, merges
  axes). In the rows axes learner m is drawn at height M − m and the global model at 0; its
  label gives its merged share when `shares` does (the share of its trained steps whose
  progress reached a merge, `metrics.merged_shares`)."""
  # A Figure on its own Agg canvas, not pyplot: drawing here never changes the backend of a
  # notebook or script that called the run.
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  from matplotlib.patches import Patch

  m_count = trace.learners
  fig = Figure(figsize=(9.0, 2.4 + 0.45 * m_count + 1.6))
  FigureCanvasAgg(fig)
  ax, axm = fig.subplots(2, 1, sharex=True, gridspec_kw=dict(height_ratios=[m_count + 1.5, 2.2]))
  # Margins fixed in inches (the labels', the title's and legend's): matplotlib's tight_layout
  # measured every text of the figure: a draw took 0.40-0.43 s of CPU with it, 0.32-0.33 without.
  width, height = fig.get_size_inches()
  gap, top, bottom = 0.3, 0.65, 0.55
  fig.subplots_adjust(
      left=1.25 / width,
      right=1 - 0.45 / width,
      top=1 - top / height,
      bottom=bottom / height,
      hspace=gap / ((height - top - bottom - gap) / 2),
  )
  bar = lambda spans, y, color: ax.broken_barh(
      [(s, e - s) for s, e in spans], (y - 0.35, 0.7), color=color, linewidth=0
  )
  for m in range(m_count):
    for kind in (TRAIN, WAIT):
      bar([(s, e) for k, s, e in trace.spans[m] if k == kind], m_count - m, COLORS[kind])
    bar([(s, e) for i, s, e in down if i == m], m_count - m, COLORS[DOWN])
  bar([(0.0, end)], 0, ADVANCING)  # the global model, unless stalled or its synchronizer down
  bar(stalled_spans([r["time"] for r in merges], end, period_s), 0, STALLED)
  bar(sync_down, 0, COLORS[DOWN])
  labels = ["global model"] + [_label(m, shares) for m in reversed(range(m_count))]
  ax.set_yticks(range(0, m_count + 1), labels)
  ax.set_ylim(-0.8, m_count + 0.8)
  legend = [("training", COLORS[TRAIN]), ("waiting", COLORS[WAIT]), ("down", COLORS[DOWN])]
  legend += [("model advancing", ADVANCING), ("model stalled", STALLED)]
  ax.legend(
      handles=[Patch(color=c, label=label) for label, c in legend],
      loc="lower center",
      bbox_to_anchor=(0.5, 1.0),
      ncol=5,
      fontsize=8,
      frameon=False,
  )
  ax.set_title(title or "timeline", fontsize=10, pad=22)
  _merges(fig, axm, merges, m_count, fragments, end)
  return fig, ax, axm


def _label(m: int, shares: Sequence[float | None]) -> str:
  share = shares[m] if m < len(shares) else None
  return f"learner {m}" if share is None else f"learner {m}\n{share:.0%} merged"


def _merges(fig, axm, merges: list[dict], m_count: int, fragments: int, end: float) -> None:
  """The merges panel: one mark per merge at its fragment's height, coloured by its quorum."""
  points = axm.scatter(
      [r["time"] for r in merges],
      [r["fragment"] for r in merges],
      s=40,
      marker="|",
      linewidths=1.5,
      c=[r["quorum"] for r in merges],
      cmap="viridis",
      vmin=0,
      vmax=m_count,
  )
  fig.colorbar(points, ax=axm, pad=0.01, fraction=0.03).set_label("quorum", fontsize=8)
  axm.yaxis.get_major_locator().set_params(integer=True)
  axm.set_ylim(-0.5, max(fragments, 1) - 0.5)
  axm.set_ylabel("merges of\nfragment", fontsize=8)
  axm.set_xlabel("simulated time (s)")
  axm.set_xlim(0, end if end > 0 else 1.0)


def draw(path: str, *args, **kwargs) -> str:
  """Writes `figure(*args, **kwargs)` to `path` as a PNG; returns `path`."""
  fig, _, _ = figure(*args, **kwargs)
  with paths.writing(path, "wb") as f:
    fig.savefig(f, dpi=110, format="png")
  return path
