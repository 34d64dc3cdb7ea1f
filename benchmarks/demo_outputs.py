"""The files `make demo` writes, as a manifest of hashes, and two manifests compared: a refactor that says it keeps
the formats (issue 34) shows here that summary.json, scores.json, model.json, run.json, the results and the
weights are the same bytes before and after.

    make demo && python benchmarks/demo_outputs.py manifest outputs --out /tmp/before.json   # on the old code
    make demo && python benchmarks/demo_outputs.py manifest outputs --out /tmp/after.json    # on the new code
    python benchmarks/demo_outputs.py compare /tmp/before.json /tmp/after.json

Each file is hashed as written, except that in JSON files the values that differ between two runs of the same code
are masked first: wall times (and the reports' `timings_s`), start stamps, the host name and the checkout's
absolute path (also in YAML, markdown and CSV files). Which keys were masked
is recorded with each file, so a masked difference is never hidden. Logs, Hydra's copies of the config, Lightning
checkpoints (they record absolute paths and loop state), locks and per-batch partial files are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

# Keys whose values change from one run of the same code to the next.
VOLATILE_KEYS = {"attack_seconds", "started", "host", "seconds", "wall_seconds", "elapsed_seconds", "timings_s"}
TEXT_SUFFIXES = {".yaml", ".md", ".csv", ".txt"}  # the checkout's path masked as in JSON
LEFT_OUT_DIRS = {".hydra", "logs", "locks", "wandb", "checkpoints"}
LEFT_OUT_SUFFIXES = {".log", ".lock", ".ckpt", ".pt"}


def _masked(value, root: str, masked: set[str], key: str = ""):
    """The JSON value with volatile keys' values and the checkout's absolute path replaced by markers."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in VOLATILE_KEYS:
                masked.add(f"{key}.{k}".lstrip("."))
                out[k] = "<volatile>"
            else:
                out[k] = _masked(v, root, masked, f"{key}.{k}")
        return out
    if isinstance(value, list):
        return [_masked(v, root, masked, f"{key}[]") for v in value]
    if isinstance(value, str) and root in value:
        masked.add(f"{key}".lstrip(".") + " (path)")
        return value.replace(root, "<checkout>")
    return value


def file_entry(path: Path, root: str) -> dict:
    """sha256 of the file's bytes, and for JSON of its masked content (sorted keys are NOT used: order counts)."""
    raw = path.read_bytes()
    entry = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    if path.suffix == ".json":
        masked: set[str] = set()
        content = _masked(json.loads(raw), root, masked)
        entry["masked_sha256"] = hashlib.sha256(json.dumps(content, indent=1).encode()).hexdigest()
        entry["masked"] = sorted(masked)
    elif path.suffix in TEXT_SUFFIXES and root.encode() in raw:
        entry["masked_sha256"] = hashlib.sha256(raw.replace(root.encode(), b"<checkout>")).hexdigest()
        entry["masked"] = ["(path)"]
    return entry


def manifest(outputs: Path) -> dict:
    """{relative path: entry} of every output file the demo's result is made of."""
    outputs = outputs.resolve()
    root = str(outputs.parent)
    files = {}
    for path in sorted(outputs.rglob("*")):
        relative = path.relative_to(outputs)
        if (not path.is_file() or path.suffix in LEFT_OUT_SUFFIXES
                or LEFT_OUT_DIRS.intersection(relative.parts[:-1]) or relative.parts[0] == "wandb"):
            continue
        files[str(relative)] = file_entry(path, root)
    return {"outputs": str(outputs), "files": files}


def compare(before: dict, after: dict) -> list[str]:
    """One line per file that is not the same (masked content for JSON, bytes for the rest)."""
    lines = []
    old, new = before["files"], after["files"]
    for name in sorted(old.keys() | new.keys()):
        if name not in new:
            lines.append(f"missing after: {name}")
        elif name not in old:
            lines.append(f"new after: {name}")
        else:
            key = "masked_sha256" if "masked_sha256" in old[name] else "sha256"
            if old[name][key] != new[name].get(key):
                lines.append(f"differs: {name}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("manifest", help="hash the outputs folder's files into a JSON manifest")
    write.add_argument("outputs", type=Path)
    write.add_argument("--out", type=Path, required=True)
    check = commands.add_parser("compare", help="name the files that differ between two manifests (exit 1 if any)")
    check.add_argument("before", type=Path)
    check.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "manifest":
        found = manifest(args.outputs)
        args.out.write_text(json.dumps(found, indent=1) + "\n")
        print(f"{len(found['files'])} files hashed into {args.out}")
        return 0
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    lines = compare(before, after)
    identical = sum(1 for n in before["files"] if n in after["files"]) - sum(l.startswith("differs") for l in lines)
    print("\n".join(lines + [f"{identical} files identical, {len(lines)} not"]))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
