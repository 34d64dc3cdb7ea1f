"""Fine-tune a timm classifier on a RobustGenBench dataset: `python train.py data=flowers102 model=convnext_b
experiment=fft50_trades trainer=gpu`. Plain `python train.py` trains the tiny CPU demo on the mini benchmark."""

import hydra
from omegaconf import DictConfig

from rgb.training import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    return train(cfg)


if __name__ == "__main__":
    main()
