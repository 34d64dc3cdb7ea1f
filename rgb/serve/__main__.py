"""`python -m rgb.serve`: the installed `rgb-serve` console script, found by its entry point, so that the server
package names no command module (the command layer imports the server, not the other way)."""

import sys
from importlib.metadata import entry_points


def main() -> None:
    found = entry_points(group="console_scripts", name="rgb-serve")
    if not found:
        sys.exit("error: python -m rgb.serve runs the rgb-serve command, which is not installed: pip install -e .")
    next(iter(found)).load()()


if __name__ == "__main__":
    main()
