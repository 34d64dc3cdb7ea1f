"""`python -m rgb.serve`: the `rgb-serve` command. A door of the house (as rgb/api.py is): what `python -m` runs
may import the command layer above its package, which nothing else in rgb.serve does."""

from rgb.commands.main import serve_main

if __name__ == "__main__":
    serve_main()
