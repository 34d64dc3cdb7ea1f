"""Score models: `python evaluate.py run=<train output dir>` (five settings, class-wise metrics, plots) or
`python evaluate.py pool=[DIR,...]` (leaderboard with Sum and Borda scores). See conf/evaluate.yaml.
Same command as the installed `rgb-evaluate`."""

from rgb.commands.main import evaluate_main

if __name__ == "__main__":
    evaluate_main()
