"""Checks of a saved figure: a real PNG, not blank, with the colours of the series a plotting
function says it drew (`spec_jax.eval.plots.Drawn`)."""

from __future__ import annotations

import matplotlib.colors
import matplotlib.image
import numpy as np

from spec_jax.eval import plots


def has_color(image: np.ndarray, color: str, tol: float = 0.02) -> bool:
    rgb = np.asarray(matplotlib.colors.to_rgb(color))
    return bool(np.any(np.all(np.abs(image[..., :3] - rgb) < tol, axis=-1)))


def read_png(path) -> np.ndarray:
    with open(path, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.0
    return image


def check_series(path, drawn: plots.Drawn, expected: dict[str, int]) -> None:
    """The figure drew exactly `expected` (label -> points) and each colour is in the PNG."""
    assert dict(drawn) == expected
    image = read_png(path)
    for label in expected:
        assert has_color(image, drawn.colors[label]), label
