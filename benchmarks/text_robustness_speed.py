"""Speed of the text-robustness measurement (issue 11): perturbation generation, then rankings, RBO_ext,
overlap@k, distances and B for every (query, perturbation) over image collections of several sizes, as JSON.

    OMP_NUM_THREADS=1 python benchmarks/text_robustness_speed.py                     # 196 x 80 x 12, N = 250..2000
    OMP_NUM_THREADS=1 python benchmarks/text_robustness_speed.py --sizes 1000 --classes 20

Features are random (dimension 512): image and text encoders are not timed here (the image features are computed
once per model and split and cached; every query then costs one text forward). A perturbed query whose text equals
its original gets the original's features, as a deduplicating encoder gives it, so undefined B values occur.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import sys
import time
from pathlib import Path

import torch

from rgb.core import atomic_write_json, configure_threads
from rgb.brittleness.metrics import classification_view, query_table, summarize
from rgb.brittleness.perturb import DEFAULT_TYPES, generate, template_queries

RESULTS = Path(__file__).resolve().parent / "results" / "text_robustness_speed_cpu.json"
ADJECTIVES = ("bad", "good", "large", "small", "dark", "bright", "blurry", "cropped", "clean", "weird")
MEDIA = ("photo", "picture", "image", "drawing", "painting", "rendering", "sketch", "snapshot")
COLOURS = ("red", "blue", "green", "black", "white", "grey", "brown", "golden", "spotted", "striped", "pale",
           "dark", "wild", "little")
THINGS = ("frog", "finch", "truck", "kettle", "maple", "beetle", "heron", "canoe", "lantern", "otter", "orchid",
          "tractor", "violin", "walrus")


def synthetic_queries(n_classes: int, n_templates: int):
    """CLIP-like prompts: 'a {adjective} {medium} of the {}.' filled with two-word class names."""
    templates = [f"a {adjective} {medium} of the {{}}." for adjective, medium in itertools.product(ADJECTIVES, MEDIA)]
    names = [f"{colour} {thing}" for colour, thing in itertools.product(COLOURS, THINGS)]
    if n_templates > len(templates) or n_classes > len(names):
        raise SystemExit(f"at most {len(templates)} templates and {len(names)} classes")
    return template_queries(templates[:n_templates], names[:n_classes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=196)
    parser.add_argument("--templates", type=int, default=80)
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000], help="collection sizes N")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=256, help="perturbed queries ranked at once")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    threads = configure_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)

    queries = synthetic_queries(args.classes, args.templates)
    start = time.perf_counter()
    perturbations = generate(queries, types=DEFAULT_TYPES, seeds=(args.seed,))
    generation_s = time.perf_counter() - start

    query_features = torch.nn.functional.normalize(torch.randn(len(queries), args.dim, generator=g), dim=1)
    source = torch.tensor([item.query_index for item in perturbations])
    unchanged = torch.tensor([item.text == item.query for item in perturbations])
    noise = 0.2 * torch.randn(len(perturbations), args.dim, generator=g) / args.dim**0.5
    perturbed_features = query_features[source] + noise * (~unchanged).unsqueeze(1)

    # Classification view: per type, a head from the sum of each class's edited prompts.
    class_of = torch.arange(len(queries)) % args.classes
    type_rows = {name: torch.tensor([item.type == name for item in perturbations]) for name in DEFAULT_TYPES}
    original_head = torch.zeros(args.classes, args.dim).index_add_(0, class_of, query_features)

    runs = []
    for n_images in args.sizes:
        images = torch.randn(n_images, args.dim, generator=g)
        labels = torch.randint(0, args.classes, (n_images,), generator=g)
        start = time.perf_counter()
        table = query_table(images, query_features, perturbed_features, perturbations, batch_size=args.batch_size)
        table_s = time.perf_counter() - start
        start = time.perf_counter()
        summary = summarize(table)
        summary_s = time.perf_counter() - start
        start = time.perf_counter()
        for rows in type_rows.values():
            head = torch.zeros(args.classes, args.dim).index_add_(0, class_of[source[rows]], perturbed_features[rows])
            classification_view(images, original_head, head, labels)
        classification_s = time.perf_counter() - start
        runs.append({
            "n_images": n_images,
            "query_table_s": round(table_s, 2),
            "per_perturbed_query_ms": round(1000 * table_s / len(perturbations), 4),
            "summary_s": round(summary_s, 2),
            "classification_view_s": round(classification_s, 2),
            "undefined_brittleness": sum(row["brittleness_undefined"] for row in summary),
        })
        print(runs[-1], file=sys.stderr)

    report = {
        "what": "text robustness metrics on random features: rankings, RBO_ext, overlap@10/50/100, intra/inter, B",
        "classes": args.classes, "templates": args.templates, "queries": len(queries),
        "perturbation_types": list(DEFAULT_TYPES), "perturbed_queries": len(perturbations),
        "feature_dim": args.dim, "batch_size": args.batch_size, "seed": args.seed,
        "generation_s": round(generation_s, 2),
        "by_collection_size": runs,
        "device": "cpu", "torch_threads": threads, "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
