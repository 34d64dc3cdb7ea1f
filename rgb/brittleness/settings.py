"""The metrics' defaults a config may change (evaluate.py's `text_robustness_options.p` and `.ks`), plain Python so
that evaluate.py's schema reads them before torch loads; rgb.brittleness.metrics computes with them."""

DEFAULT_P = 0.99  # RBO's persistence: instability = 1 - RBO_ext(p)
DEFAULT_KS = (10, 50, 100)  # the k of overlap@k
