"""Deterministic pictures for image domains: a matplotlib figure -> byte-identical PNG.

Same drawing calls -> the same bytes, on every run and in every process: the figure is drawn
with matplotlib's Agg rasteriser under a fixed style (its own defaults, the bundled DejaVu fonts,
a fixed size and DPI), and the PNG is written without the metadata matplotlib would add (the
`Software` tag names its version; nothing time-dependent is written). What this does *not* make
equal: bytes across matplotlib or FreeType versions (glyph rasterising changes) -- a replay on a
machine with other versions reports the image hashes as different, which is what they are.

Matplotlib's style settings are process-global, so drawing is serialised by a lock (episodes
run in threads).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from posttrain.values.image import Image

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 80
_LOCK = threading.Lock()
_STYLE: dict[str, Any] = {"font.family": "DejaVu Sans", "font.size": 10.0, "axes.titlesize": 11.0,
          "svg.hashsalt": "posttrain", "path.simplify": False, "figure.dpi": DPI,
          "savefig.dpi": DPI, "agg.path.chunksize": 0}


@contextmanager
def figure(width_px: int, height_px: int) -> Iterator[Figure]:
    """A fresh figure of exactly width x height pixels, drawn under the fixed style; yields the
    `Figure` (use its `add_subplot`/`add_axes`); the picture is taken with `png(fig)` inside."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with _LOCK, matplotlib.style.context("default"), matplotlib.rc_context(_STYLE):  # type: ignore[arg-type]
        fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
        FigureCanvasAgg(fig)
        yield fig


def png(fig: Figure) -> Image:
    """The figure as PNG bytes with no metadata (call inside `figure(...)`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return Image(buf.getvalue(), "image/png")
