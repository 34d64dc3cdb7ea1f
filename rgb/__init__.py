"""rgb: fine-tune, attack and score image classifiers on RobustGenBench."""

__version__ = "0.1.0"
