"""What every figure of every analysis shares: the 1-based head label and one way to save.

Figures are written atomically (a temporary name, renamed when complete) at one resolution,
PNG for the report and an SVG beside it (every figure has both).
"""

from __future__ import annotations

from pathlib import Path

from .io import atomic_path

DPI = 150  # the one resolution of every PNG


def head_label(layer, head) -> str:
    """The papers' printed 1-based 'layer-head' label of a 0-based head."""
    return f"{int(layer) + 1}-{int(head) + 1}"


def save_figure(fig, png: str | Path, svg: str | Path) -> None:
    """Write ``fig`` atomically as PNG at :data:`DPI` and as SVG, then close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(png) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
        with atomic_path(svg) as tmp:
            fig.savefig(tmp, format="svg", bbox_inches="tight")
    finally:
        plt.close(fig)
