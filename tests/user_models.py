"""A user's own classifier, not timm and not CLIP: what a `factory` model.json points at in the tests."""

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
