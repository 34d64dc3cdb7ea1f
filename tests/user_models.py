"""A user's own classifiers, not timm and not CLIP: what a `factory` model.json and `rgb.benchmark` accept."""

import torch
from torch import nn


class PixelMLP(nn.Module):
    """[0,1] images -> logits, with its own normalisation constant inside."""

    def __init__(self, num_classes: int = 10, image_size: int = 32, hidden: int = 16):
        super().__init__()
        self.register_buffer("centre", torch.tensor(0.5))
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, hidden), nn.ReLU())
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.body(x - self.centre))


def build_pixel_mlp(num_classes: int = 10, image_size: int = 32, hidden: int = 16) -> PixelMLP:
    return PixelMLP(num_classes, image_size, hidden)


class SmallCNN(nn.Module):
    """[0,1] images (N,3,32,32) -> 10 logits; normalisation inside, as the suite requires."""

    def __init__(self, width: int = 8, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x * 2 - 1))


def small_cnn(width: int = 8, num_classes: int = 10, seed: int = 0) -> SmallCNN:
    """The factory a `model.json` can name (`user_models:small_cnn`)."""
    torch.manual_seed(seed)
    return SmallCNN(width, num_classes)


def trained_small_cnn(mini_dir, epochs: int = 3, seed: int = 0) -> SmallCNN:
    """SmallCNN fitted for a few epochs on the mini train split (a few seconds): a model an attack can break."""
    from torch.utils.data import DataLoader

    from rgb.data import BenchmarkData

    model = small_cnn(seed=seed)
    data = BenchmarkData(source=str(mini_dir), dataset="digits", image_size=32, num_classes=10,
                         budgets={"l1": 1.0, "l2": 1.0, "linf": 1.0})
    loader = DataLoader(data.split("train"), batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        for x, y, _ids in loader:
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimiser.step()
    return model.eval()
