"""Real data and small models that several lessons train (lesson 01 onwards).

The data set is scikit-learn's handwritten digits (1,797 images of 8x8 pixels), which ships
inside the scikit-learn package: nothing is downloaded when a lesson runs.
"""

from __future__ import annotations

import torch
from torch import nn


def digits(device: torch.device | str = "cpu", test_fraction: float = 0.25, seed: int = 0):
    """The digits data as float32 tensors ``(x_train, y_train, x_test, y_test)`` (lesson 01).

    Pixels are scaled to [0, 1]; the split is a fixed random permutation from ``seed``.
    """
    from sklearn.datasets import load_digits

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (t.to(device) for t in (x[train], y[train], x[test], y[test]))


def mlp(
    sizes: tuple[int, ...] = (64, 256, 256, 10), norm: bool = False, dropout: float = 0.0
) -> nn.Sequential:
    """An MLP with ReLU between layers (lesson 01), optional BatchNorm before each ReLU and,
    with ``dropout`` > 0, Dropout after it (lesson 05)."""
    if len(sizes) < 2:
        raise ValueError(f"an MLP needs at least an input and an output size, got {sizes}")
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            if norm:
                layers.append(nn.BatchNorm1d(n_out))
            layers.append(nn.ReLU())
            if dropout:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)
