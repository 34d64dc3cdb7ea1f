"""What AutoAttack's `capture="auto"` (a TorchScript trace of the model, run without graph optimisations) saves per
model call, and that it changes nothing: the reference_speed models (robust tiny ViT and small CNN, cached in
--cache, trained there when missing), one thread.

    python benchmarks/model_capture.py --out benchmarks/results/model_capture_cpu.json

Per model and batch size (the few rows of a tail of robust points up to a full batch): the time of a forward
without a graph and of a forward and backward to the input, eager (the model as the attacks call it without a
trace: NHWC inputs for the CNN) against the trace; the two alternate, --repeats rounds, median per round, and the
logits and gradients are compared bit for bit. Then the whole standard AutoAttack (seed 0) on the model's robust
test images among the first --n (the points still robust after APGD-CE), eager then traced: wall time, rows, and
whether x_adv and the codes of `fooled_by` are identical.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from reference_speed import MODELS, cached_model, digits
from rgb.attacks.autoattack import AutoAttack
from rgb.attacks.model_calls import ChannelsLastInputs, TracedModel
from rgb.attacks.common import EvalCounter
from rgb.core.files import atomic_write_json
from rgb.core.threat import Norm
from rgb.data.catalog import WHITE_BOX_BUDGETS, scale_budget


def seconds_per_call(call, calls: int) -> float:
    call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


def forward_backward(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    image = x.clone().requires_grad_(True)
    logits = model(image)
    return logits.detach(), torch.autograd.grad(logits.sum(), image)[0]


def per_call(eager, traced, x: torch.Tensor, rows: int, repeats: int) -> dict:
    batch = x[:rows]
    calls = max(20, 400 // rows)
    times = {key: [] for key in ("forward_eager", "forward_traced", "forward_backward_eager",
                                 "forward_backward_traced")}
    for _ in range(repeats):
        for name, model in (("eager", eager), ("traced", traced)):
            with torch.inference_mode():
                times[f"forward_{name}"].append(seconds_per_call(lambda: model(batch), calls))
            times[f"forward_backward_{name}"].append(seconds_per_call(lambda: forward_backward(model, batch),
                                                                      max(10, calls // 3)))
    median = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    same = all(torch.equal(a, b) for a, b in zip(forward_backward(eager, batch), forward_backward(traced, batch)))
    return {"rows": rows, **{f"{key}_ms": value for key, value in median.items()},
            "forward_speedup": median["forward_eager"] / median["forward_traced"],
            "forward_backward_speedup": median["forward_backward_eager"] / median["forward_backward_traced"],
            "bitwise_equal": same}


def whole_attack(net, x, y, norm: str) -> dict:
    eps = scale_budget(norm, WHITE_BOX_BUDGETS[norm], x[0].numel())
    robust = AutoAttack(net, norm, eps, attacks=["apgd-ce"], capture="eager").run(x, y).robust
    x, y = x[robust], y[robust]  # the points whose whole cascade runs: where a tail's calls are few rows
    outcome = {}
    for capture in ("eager", "auto"):
        started = time.perf_counter()
        result = AutoAttack(net, norm, eps, capture=capture).run(x, y)
        outcome[capture] = {"seconds": time.perf_counter() - started, "n_robust": int(result.robust.sum()),
                            "forward_rows": float(result.forward_rows.sum()),
                            "backward_rows": float(result.backward_rows.sum()), "result": result}
    eager, traced = outcome["eager"].pop("result"), outcome["auto"].pop("result")
    return {"norm": norm, "eps": eps, "images": len(x), **outcome,
            "speedup": outcome["eager"]["seconds"] / outcome["auto"]["seconds"],
            "identical": torch.equal(eager.x_adv, traced.x_adv) and torch.equal(eager.fooled_by, traced.fooled_by)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vit-pgd_at", "cnn-pgd_at"], choices=list(MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 5, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n", type=int, default=32, help="test images whose APGD-CE survivors are attacked whole")
    parser.add_argument("--norms", nargs="*", default=["linf"], choices=[n.key for n in Norm])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "rgb-benchmark-models")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x, y = digits("test")
    records = []
    for name in args.models:
        net = MODELS[name][0]()
        net.load_state_dict(torch.load(cached_model(name, args.cache), weights_only=True))
        net = net.eval().requires_grad_(False)
        eager = ChannelsLastInputs(net) if any(isinstance(m, torch.nn.Conv2d) for m in net.modules()) else net
        traced = TracedModel.trace(eager, x[:2], EvalCounter())
        calls = [per_call(eager, traced, x, rows, args.repeats) for rows in args.rows]
        attacks = [whole_attack(net, x[:args.n], y[:args.n], norm) for norm in args.norms]
        records.append({"model": name, "per_call": calls, "autoattack": attacks})
        for call in calls:
            print(f"{name} {call['rows']:>3} rows: forward {call['forward_speedup']:.2f}x, forward+backward "
                  f"{call['forward_backward_speedup']:.2f}x, bitwise equal {call['bitwise_equal']}", flush=True)
        for attack in attacks:
            print(f"{name} {attack['norm']} AutoAttack on {attack['images']} APGD-CE survivors: eager "
                  f"{attack['eager']['seconds']:.1f} s, traced {attack['auto']['seconds']:.1f} s = "
                  f"{attack['speedup']:.2f}x, identical {attack['identical']}", flush=True)
    atomic_write_json(Path(args.out), {
        "what": "AutoAttack capture=auto (TorchScript trace, unoptimised) against the eager model, one thread",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
        "records": records,
    })


if __name__ == "__main__":
    main()
