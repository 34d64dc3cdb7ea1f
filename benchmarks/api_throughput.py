"""API model throughput against rgb-serve on 127.0.0.1: the full 9-setting black-box run of the mini benchmark
(test, common and the 7 transfer splits) asked at max_concurrency 1, 4 and 16, each from an empty answer cache.

    python benchmarks/api_throughput.py                        # builds what it needs under a temporary directory
    python benchmarks/api_throughput.py --work DIR --concurrency 1 4 16

What it builds: the mini benchmark; 7 transfer splits whose unmodified rows are, as on the card, the test images
a surrogate (the attack tests' tiny ViT, 4 epochs) gets wrong, and whose other rows carry a random perturbation
within the budget (rgb-transfer's AutoAttack would take most of an hour of a loaded CPU for the L1 splits, and
which images are distinct is what matters here); the embedded zero-shot CLIP (its architecture, random init:
serving cost does not depend on the weights) behind rgb-serve. Per concurrency: requests/s and evaluation wall time; the share of images the cache
answered (the unmodified transfer rows are the clean test images); a re-run (must send 0 requests). Then the
client's own cost per request (PNG -> base64 data URL + JSON body, answer parse) and one round trip through the
openai SDK, against the server's model time. Then the Batch path (`model.batch=true`) over the test split's images
from an empty cache: its round trip (JSONL, upload, batch run by rgb-serve's Batches endpoint, poll, download, parse
into the cache) and whether its cache records equal the online path's.
The machine may be shared: its load average is recorded with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from hydra import compose, initialize_config_dir

from rgb.commands.resolvers import register_resolvers
from rgb.core import atomic_write_json
from rgb.data.export import noise_transfer_splits
from rgb.evaluation.endpoint_eval import cache_path, split_images
from rgb.evaluation.records import ScoresRecord
from rgb.commands.evaluate import run_evaluation
from rgb.models import library_versions, load_with_meta
from rgb.endpoints.answers import parse_answer
from rgb.models.chat import ChatClassifier
from rgb.endpoints.cache import AnswerCache
from rgb.serve import ServeRequest, make_server

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
SURROGATE = [
    "model.name=vit_tiny_patch16_224", "+model.img_size=32", "+model.patch_size=16", "+model.embed_dim=64",
    "+model.depth=1", "+model.num_heads=1", "+model.global_pool=avg", "+model.class_token=false",
    "optim.backbone_lr=3e-3", "optim.head_lr=3e-3", "trainer.max_epochs=4", "trainer.accelerator=cpu",
    "callbacks.progress_bar.refresh_rate=0", "run_name=surrogate",
]


def config(name: str, work: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(name, overrides=[f"paths.root_dir={work}", f"paths.mini_dir={work / 'mini'}", *overrides])


def prepare(work: Path) -> tuple[Path, Path]:
    """(served zero-shot CLIP run, mini benchmark with transfer splits), built once in `work`."""
    import torch

    from rgb.data import ImageSplit, load_split
    from rgb.data.mini import ensure_mini
    from rgb.commands.train import train

    ensure_mini(work / "mini")
    runs = work / "outputs" / "train" / "digits"
    surrogate, clip = runs / "surrogate", runs / "zs_clip"
    if not (surrogate / "model.json").is_file():
        train(config("train", work, *SURROGATE, f"run_dir={surrogate}"))
    if len(list((work / "mini" / "data" / "digits" / "surrogate").glob("*.parquet"))) < 7:
        test = ImageSplit(load_split(str(work / "mini"), "digits", "test"), 32)
        with torch.inference_mode():
            pred = load_with_meta(surrogate)[0](torch.stack([test[i][0] for i in range(len(test))])).argmax(1)
        noise_transfer_splits(work / "mini", test, (pred == test.labels).tolist(), "surrogate")
    if not (clip / "model.json").is_file():
        train(config("train", work, "model=openclip_mini", "model.random_init=true", "strategy=zeroshot",
                     "prompts=single", f"run_dir={clip}", "callbacks.progress_bar.refresh_rate=0"))
    return clip, work / "mini"


def evaluate(work: Path, run: Path, *overrides: str) -> tuple[ScoresRecord, float]:
    start = time.perf_counter()
    run_evaluation(config("evaluate", work, f"run={run}", "protocol=black_box", *overrides))
    seconds = time.perf_counter() - start
    return ScoresRecord.load(work / "outputs" / "eval" / "digits" / run.name / "scores.json"), seconds


def client_overhead(model, server, images: list[bytes]) -> dict:
    """Per request: the client's encode + parse, the server's decode + forward, and one whole round trip through
    the openai SDK to rgb-serve (medians over the images); round trip minus model time is what the client and
    HTTP cost on top of the model."""
    encode, parse, serve, round_trip = [], [], [], []
    with model.endpoint.session() as sdk:
        for image in images:
            start = time.perf_counter()
            body = model.body(image)
            json.dumps(body)
            encode.append(time.perf_counter() - start)
            start = time.perf_counter()
            answer = server.classify(image)
            serve.append(time.perf_counter() - start)
            start = time.perf_counter()
            parse_answer(answer, model.class_names)
            parse.append(time.perf_counter() - start)
            start = time.perf_counter()
            model.endpoint.post_once(sdk, body, None)
            round_trip.append(time.perf_counter() - start)
    ms = {name: 1e3 * statistics.median(times) for name, times in
          (("encode_ms", encode), ("parse_ms", parse), ("server_model_ms", serve), ("round_trip_ms", round_trip))}
    return {**ms, "client_and_http_ms": ms["round_trip_ms"] - ms["server_model_ms"], "images": len(images)}


def batch_round_trip(model, server, images: list[bytes], work: Path, online_cache: Path, poll_s: float) -> dict:
    """The Batch path's wall time for `images` from an empty cache (upload -> completed -> parsed into the cache,
    polled every poll_s), and its cache records against the online path's for the same keys."""
    batched = ChatClassifier(model.settings, replace(model.client_settings, batch=True, batch_poll_s=poll_s),
                            model.class_names, model.dataset)
    cache = AnswerCache(work / "api_cache_batch" / "answers.jsonl")
    asked_before, batches_before = server.requests.count(), len(server.batches.batches)
    start = time.perf_counter()
    _answers, stats = batched.answer(images, cache)
    seconds = time.perf_counter() - start
    cache.close()
    online = AnswerCache(online_cache)
    same = all(online.get(key) == record for key, record in cache.answers.items())
    return {"images": len(images), "requests": stats.requests, "round_trip_s": seconds,
            "requests_per_s": stats.requests / seconds, "poll_s": poll_s,
            "server_requests": server.requests.count() - asked_before,
            "batches": len(server.batches.batches) - batches_before, "unanswered": stats.unanswered,
            "same_records_as_online": same and len(cache.answers) > 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="build/reuse everything here (default: a temp dir)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--out", type=Path, default=RESULTS / "api_throughput_cpu.json")
    parser.add_argument("--batch-poll-s", type=float, default=0.5, help="the Batch path's polling period")
    args = parser.parse_args()
    register_resolvers()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as scratch:
        work = (args.work or Path(scratch)).resolve()
        load_before = os.getloadavg()
        clip, _ = prepare(work)
        server = make_server(ServeRequest(run=clip, served_name="zs_clip"))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        from rgb.commands.train import train

        rows = []
        direct, direct_s = evaluate(work, clip)
        for concurrency in args.concurrency:
            run = work / "outputs" / "train" / "digits" / f"api_c{concurrency}"
            train(config("train", work, "model=api_chat", f"model.base_url={server.base_url}",
                         "model.api_model=zs_clip", f"model.name={run.name}", f"run_dir={run}",
                         f"model.max_concurrency={concurrency}"))
            cache = work / f"api_cache_c{concurrency}"
            asked_before = server.requests.count()
            record, seconds = evaluate(work, run, f"api_cache_dir={cache}")
            sent = server.requests.count() - asked_before
            again, again_s = evaluate(work, run, f"api_cache_dir={cache}")
            total = record.api.total
            rows.append({
                "max_concurrency": concurrency, "images": int(total["images"]), "requests": sent,
                "wall_s": seconds, "requests_per_s": sent / seconds, "cache_share": 1 - sent / total["images"],
                "rerun_requests": int(again.api.total["requests"]), "rerun_wall_s": again_s,
                "same_score_as_direct": record.black_box.score == direct.black_box.score,
                "black_box_score": record.black_box.score, "load_avg_after": os.getloadavg(),
            })
            print(rows[-1])
        model, _ = load_with_meta(work / "outputs" / "train" / "digits" / f"api_c{args.concurrency[0]}")
        from rgb.data import ImageSplit, load_split

        test = ImageSplit(load_split(str(work / "mini"), "digits", "test"), 32)
        overhead = client_overhead(model, server, split_images(test, len(test)))
        online_cache = cache_path(work / f"api_cache_c{args.concurrency[0]}", model)
        batch = batch_round_trip(model, server, split_images(test, len(test)), work, online_cache, args.batch_poll_s)
        print(batch)
        server.shutdown()
    result = {
        "benchmark": "api_throughput", "served": "embedded zero-shot CLIP (rgb-mini-clip, random init) via rgb-serve",
        "settings": 9, "direct_evaluate_wall_s": direct_s, "runs": rows, "per_request": overhead,
        "batch": batch,
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_avg_before": load_before,
                    "load_avg_after": os.getloadavg(), "shared": True, "threads": os.environ.get("RGB_THREADS")},
        "versions": library_versions(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
