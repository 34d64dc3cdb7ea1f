"""A toy classification problem for exercising attacks in seconds on a CPU: 3x8x8 images in [0,1] that separate
by class, and a small MLP fitted to them (the attack tests, tests/test_runs_agreement.py and the benchmarks
fast_vs_standard and serve_throughput). In the library so that tests and benchmarks share it without importing
each other."""

import torch
from torch import nn


def separable_data(n: int, seed: int, n_classes: int = 10):
    """3x8x8 images at 0.5 +- 0.1 along a fixed random sign pattern per class, plus noise."""
    prototypes = torch.sign(torch.randn(n_classes, 3, 8, 8, generator=torch.Generator().manual_seed(123)))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = (0.5 + 0.1 * prototypes[y] + 0.05 * torch.randn(n, 3, 8, 8, generator=g)).clamp(0, 1)
    return x, y


def train_mlp(n_classes: int = 10, steps: int = 200) -> nn.Module:
    """A small MLP fitted to `separable_data`: accurate, partly robust at moderate eps, broken at large eps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 64), nn.ReLU(), nn.Linear(64, n_classes))
    x, y = separable_data(512, seed=0, n_classes=n_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.eval().requires_grad_(False)
