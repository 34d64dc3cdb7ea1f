"""Fine-tune a classifier on a RobustGenBench dataset: `python train.py data=flowers102 model=convnext_b
experiment=fft50_trades trainer=gpu`. Plain `python train.py` trains the tiny CPU demo on the mini benchmark.
Same command as the installed `rgb-train`."""

from rgb.commands.main import train_main

if __name__ == "__main__":
    train_main()
