"""What every figure of every analysis shares: the 1-based head label, one orientation of
layers x heads grids, a width the report can show, and one way to save.

Figures are written atomically (a temporary name, renamed when complete) at one resolution,
PNG for the report and an SVG beside it (every figure has both).

Conventions (docs/usage.md "Conventions"): heads are named 1-based ``layer-head`` (:func:`head_label`);
every layers x heads grid has layer 1 at the top and head 1 at the left (:func:`layer_head_axes`);
layer axes are labelled 1-based (:func:`layer_ticks`).
"""

from __future__ import annotations

from pathlib import Path

from .io import atomic_path

DPI = 150  # the one resolution of every PNG
# the report shows a PNG at the width of its pane (about 1,600 px on a wide screen): wider figures
# are shrunk until their text is unreadable, so grids of panels wrap into rows below this width
MAX_WIDTH_IN = 11.0


def head_label(layer, head) -> str:
    """The papers' printed 1-based 'layer-head' label of a 0-based head."""
    return f"{int(layer) + 1}-{int(head) + 1}"


def layer_ticks(n: int) -> tuple[list[int], list[str]]:
    """Tick positions (0-based indices) and 1-based labels for an axis of ``n`` layers or heads:
    every one up to 16, else every second (up to 40) or fifth."""
    step = 1 if n <= 16 else 2 if n <= 40 else 5
    pos = list(range(0, n, step))
    return pos, [str(i + 1) for i in pos]


def layer_head_axes(ax, n_layers: int, n_heads: int, head_axis: str = "head", fontsize: float = 7) -> None:
    """The one orientation of a layers x heads grid drawn at cell centres (layer, head) = (y, x),
    0-based: layer 1 at the top, head 1 at the left, both labelled 1-based."""
    ax.set_xlim(-0.5, n_heads - 0.5)
    ax.set_ylim(n_layers - 0.5, -0.5)
    ax.set_xticks(*layer_ticks(n_heads), fontsize=fontsize)
    ax.set_yticks(*layer_ticks(n_layers), fontsize=fontsize)
    ax.set_xlabel(f"{head_axis} (1-based)", fontsize=fontsize + 1)
    ax.set_ylabel("layer (1-based; 1 = first)", fontsize=fontsize + 1)


def panel_columns(n_panels: int, panel_width: float, most: int = 5) -> int:
    """Columns of a grid of ``n_panels`` panels ``panel_width`` inches wide: at most ``most``, and
    as many as fit in :data:`MAX_WIDTH_IN` (at least one)."""
    fit = max(1, int(MAX_WIDTH_IN // max(panel_width, 1e-9)))
    return max(1, min(most, n_panels, fit))


def save_figure(fig, png: str | Path, svg: str | Path) -> None:
    """Write ``fig`` atomically as PNG at :data:`DPI` and as SVG, then close it."""
    import matplotlib.pyplot as plt

    try:
        # the layout first, then frozen: a constrained layout moves the axes only when the figure is drawn (a box
        # taken before cuts what it moves out) and moves them again at each draw (equal-aspect panels: a box taken
        # after one draw misses the next, savefig's); at the PNG's resolution, which text sizes depend on
        fig.set_dpi(DPI)
        fig.draw_without_rendering()
        fig.set_layout_engine("none")
        # the tight box (a full layout pass over every text) once, for both files: bbox_inches="tight" takes it
        # again in each savefig (half of a figure job's CPU time on many-panel figures)
        bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(plt.rcParams["savefig.pad_inches"])
        with atomic_path(png) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches=bbox)
        with atomic_path(svg) as tmp:
            fig.savefig(tmp, format="svg", bbox_inches=bbox)
    finally:
        plt.close(fig)
