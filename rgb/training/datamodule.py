"""Training's Lightning DataModule: a benchmark dataset (rgb.data.BenchmarkData) with augmented, shuffled training
batches and the validation loader Lightning asks for. It lives here, not in rgb.data, so that only training imports
Lightning."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader
from torchvision import transforms

from rgb.data.benchmark import ImageSplit
from rgb.data.benchmark_data import BenchmarkData


def paper_augmentation(hflip: bool = True, color_jitter: float = 0.25, rotation: float = 2.0):
    """The paper's training augmentation (after the squash-resize done at decode time)."""
    steps = [transforms.RandomHorizontalFlip()] if hflip else []
    if color_jitter:
        steps.append(transforms.ColorJitter(color_jitter, color_jitter, color_jitter))
    if rotation:
        steps.append(transforms.RandomRotation(rotation))
    return transforms.Compose(steps) if steps else None


class RGBDataModule(BenchmarkData, L.LightningDataModule):
    """BenchmarkData that Lightning can fit on, built from the same data config (rgb.training.run), with the
    training split augmented (`augment`, paper_augmentation) and shuffled."""

    def __init__(self, *args, **kwargs):
        L.LightningDataModule.__init__(self)
        BenchmarkData.__init__(self, *args, **kwargs)

    def setup(self, stage: str | None = None) -> None:
        self.class_names  # fail early on a wrong class count

    def augmented_split(self) -> ImageSplit:
        """The training split with the paper's augmentation (the cached split stays as stored)."""
        return ImageSplit(self.split("train").rows, self.image_size, paper_augmentation(**self.augment))

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.augmented_split(), self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.split("validation"), self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")

