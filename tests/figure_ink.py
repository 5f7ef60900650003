"""A figure is clipped when ink reaches the edge of its image: :func:`edge_ink` names the edges of a PNG
whose outermost pixel row or column differs from the background (white: every figure's face)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

EDGES = ("top", "bottom", "left", "right")


def edge_ink(png: str | Path, background=(1.0, 1.0, 1.0), tol: float = 1.5 / 255) -> list[str]:
    """The edges of ``png`` (top, bottom, left, right) with at least one non-background pixel."""
    import matplotlib.image as mpimg

    img = np.asarray(mpimg.imread(str(png)), dtype=float)
    if img.ndim == 2:
        img = img[..., None].repeat(3, axis=2)
    rgb = img[..., :3]
    if img.shape[2] == 4:  # transparent pixels show the background
        a = img[..., 3:]
        rgb = rgb * a + np.asarray(background) * (1 - a)
    ink = np.abs(rgb - np.asarray(background)).max(axis=2) > tol
    return [e for e, line in zip(EDGES, (ink[0], ink[-1], ink[:, 0], ink[:, -1])) if line.any()]


def clipped_figures(root: str | Path, skip: tuple[str, ...] = ("ci-artifacts",)) -> dict[str, list[str]]:
    """Every PNG below ``root`` with ink on an edge: {path relative to root: edges}. Folders named in ``skip``
    are left out: ``ci-artifacts`` holds the atlas page's browser screenshots, which fill their frame."""
    root = Path(root)
    pngs = [p for p in sorted(root.rglob("*.png")) if not skip or not set(p.relative_to(root).parts) & set(skip)]
    out = {str(p.relative_to(root)): edge_ink(p) for p in pngs}
    return {k: v for k, v in out.items() if v}
