"""Hashes of every attack's output at every norm, so a speed change can show it is bit for bit (issue 54).

    python benchmarks/attack_pins.py --out /tmp/pins_before.json            # on the commit before
    python benchmarks/attack_pins.py --out /tmp/pins_after.json --against /tmp/pins_before.json

Each attack of the "plus" version runs alone (AutoAttack's `attacks=[name]`: the clean pass, then that attack over
the correctly classified images) and the whole standard cascade runs, at L1, L2 and Linf with the card budgets, on
the PGD-AT small CNN of benchmarks/reference_speed.py (trained there and cached outside the repository) and the
first --n mini test images, in one thread, with the model eager and the input layout fixed (`--input-format`), so
nothing timed can change the path. A record holds the SHA-256 of the adversarial images' bytes, of the robust flags
and of the per-image attack that fooled each image, plus the robust count; `--against` compares two records key by
key, prints what differs and exits 1 if anything does. A change inside the agreement allowance (spec §9.10) shows up
here as a differing hash with its robust counts, which the caller then states.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from reference_speed import MODELS, cached_model, digits
from rgb.attacks.autoattack import AutoAttack
from rgb.attacks.registry import VERSIONS
from rgb.core.files import atomic_write_json
from rgb.core.threat import Norm, parse_norm
from rgb.data.catalog import WHITE_BOX_BUDGETS, scale_budget


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def pin(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, norm: Norm, eps: float, attacks, version: str,
        input_format: str, seed: int) -> dict:
    started = time.process_time()
    result = AutoAttack(model, norm, eps, version=version, attacks=attacks, seed=seed, capture="eager",
                        input_format=input_format).run(x, y, batch_size=len(x))
    return {"x_adv": _digest(result.x_adv), "robust": _digest(result.robust), "fooled_by": _digest(result.fooled_by),
            "robust_count": int(result.robust.sum()), "cpu_seconds": round(time.process_time() - started, 2)}


def compare(after: dict, before: dict) -> list[str]:
    """The keys whose hashes differ (or that only one record has), each with both robust counts."""
    differences = []
    for key in sorted(set(after) | set(before)):
        a, b = after.get(key), before.get(key)
        if a is None or b is None:
            differences.append(f"{key}: only in {'before' if a is None else 'after'}")
        elif any(a[field] != b[field] for field in ("x_adv", "robust", "fooled_by")):
            differences.append(f"{key}: differs (robust {b['robust_count']} -> {a['robust_count']})")
    return differences


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn-pgd_at", choices=list(MODELS))
    parser.add_argument("--n", type=int, default=32, help="test images (the first n of the mini test split)")
    parser.add_argument("--norms", nargs="+", default=[n.key for n in Norm], choices=[n.key for n in Norm])
    parser.add_argument("--input-format", default="contiguous", choices=["contiguous", "channels_last"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eps-scale", type=float, default=1.0,
                        help="times the card budget (scaled to the image size): >1 lets attacks succeed, so robust "
                             "counts can show an allowance")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "rgb-benchmark-models")
    parser.add_argument("--out", required=True)
    parser.add_argument("--against", help="a record of this script to compare with")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = MODELS[args.model][0]()
    model.load_state_dict(torch.load(cached_model(args.model, args.cache), weights_only=True))
    model.eval().requires_grad_(False)
    x, y = digits("test")
    x, y = x[:args.n], y[:args.n]
    pins = {}
    for norm in (parse_norm(key) for key in args.norms):
        eps = args.eps_scale * scale_budget(norm, WHITE_BOX_BUDGETS[norm.key], x[0].numel())
        runs = [(name, [name], "plus") for name in VERSIONS["plus"].attacks]
        runs.append(("autoattack-standard", None, "standard"))
        for name, attacks, version in runs:
            key = f"{norm.key}/{name}"
            pins[key] = pin(model, x, y, norm, eps, attacks, version, args.input_format, args.seed)
            print(key, pins[key], flush=True)
    record = {"model": args.model, "n": args.n, "seed": args.seed, "input_format": args.input_format,
              "eps_scale": args.eps_scale,
              "torch": torch.__version__, "pins": pins}
    atomic_write_json(Path(args.out), record)
    if args.against:
        differences = compare(pins, json.loads(Path(args.against).read_text())["pins"])
        print("\n".join(differences) or "all pins identical")
        sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
