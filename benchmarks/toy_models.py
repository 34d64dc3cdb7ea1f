"""Tiny models and data shared by the attack tests (CPU, seconds)."""

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


def assert_attack_invariants(model, x, y, x_adv, fooled, norm, eps):
    """Spec §8.3: flags match the model on x_adv, no NaN, in [0,1], within budget, unfooled points untouched."""
    from rgb.attacks.autoattack import within_budget

    assert torch.all((model(x_adv).argmax(dim=1) != y) == fooled)
    assert not torch.isnan(x_adv).any()
    assert torch.all((x_adv >= 0) & (x_adv <= 1))
    assert torch.all(within_budget(x_adv - x, norm, eps))
    assert torch.equal(x_adv[~fooled], x[~fooled])
