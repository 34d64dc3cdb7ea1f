"""Plain functions and constants that several test modules share. Fixtures that several modules share are in
conftest.py; no test module imports another (tests/test_layers.py checks it).

Also helper modules of their own: user_models (named by `factory` model.json files), hub_cache. What
tests share with benchmarks/ is in rgb (rgb.models.toy, rgb.runs.agreement, rgb.data.export.noise_transfer_splits):
no test imports a benchmark script.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]  # the checkout: the one place tests find it
CONF = REPO / "conf"
RGB = REPO / "rgb"
TESTS = REPO / "tests"

NO_PROGRESS_BAR = "callbacks.progress_bar.refresh_rate=0"
# What every composed test config sets, per config name, before the test's own overrides (which win): training on
# the CPU whatever the machine, no progress output.
TEST_DEFAULTS = {
    "train": ("trainer.accelerator=cpu", NO_PROGRESS_BAR),
    "attack": ("progress=false",),
    "transfer": ("progress=false",),
}
# Overrides that keep a training test quick: small batches, no progress bar (also for train.py in a subprocess).
FAST = ["data.batch_size=16", "data.eval_batch_size=32", NO_PROGRESS_BAR]


def compose_config(name: str, *overrides: str, return_hydra_config: bool = False):
    """conf/<name>.yaml with the test defaults of `name` (TEST_DEFAULTS), then `overrides`, through Hydra's compose
    API: the one way tests compose a config (the conftest `compose` fixture is this function)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=[*TEST_DEFAULTS.get(name, ()), *overrides],
                       return_hydra_config=return_hydra_config)


def compose_train(run_dir: Path, mini_dir: Path, *overrides: str):
    """The real conf/train.yaml with a run dir and the mini benchmark."""
    return compose_config("train", f"run_dir={run_dir}", f"data.source={mini_dir}", *overrides)


# A tiny, randomly initialised embedded CLIP on the mini benchmark (the zero-shot and robust CLIP training tests).
TINY_CLIP = ["model=openclip_mini", "model.random_init=true", "data.eval_batch_size=128"]


def compose_tiny_clip(tmp_path: Path, mini_dir: Path, *overrides: str):
    """conf/train.yaml for TINY_CLIP, its run dir and data dir under `tmp_path`."""
    return compose_config("train", f"run_dir={tmp_path / 'run'}", f"data.source={mini_dir}",
                          f"paths.data_dir={tmp_path / 'data'}", *TINY_CLIP, *overrides)


def compose_rooted(name: str, root: Path, mini_dir: Path, *overrides: str):
    """Any of the commands' configs with everything under `root` (outputs/ and data/, as RGB_ROOT does)."""
    return compose_config(name, f"paths.root_dir={root}", f"paths.mini_dir={mini_dir}", *overrides)


def resolved(cfg) -> dict:
    """A composed config as the library reads it: resolved into plain values (what rgb.commands hands it)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def scoring(attack_dir: Path, out_dir: Path, **fields):
    """The EvalRequest that the scoring steps of rgb.evaluation.model_eval read, as rgb.evaluation.run.evaluate
    resolves it (a CPU device, the attack runs' dir), for a model and data the test hands them itself."""
    from rgb.evaluation.request import EvalRequest, RunOutputs

    fields = {"device": "cpu", "batch_size": 256, **fields}
    return EvalRequest(RunOutputs(Path("-"), "-", Path(out_dir)), Path(attack_dir), data=lambda: None, **fields)


@contextmanager
def raises_one_line(error: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None
                    ) -> Iterator[pytest.ExceptionInfo]:
    """`pytest.raises(error, match=match)` for an error a user sees: its text must also be one line (the commands
    print it as it is, rgb.core.errors.UserError)."""
    with pytest.raises(error, match=match) as caught:
        yield caught
    assert "\n" not in str(caught.value), f"not one line: {str(caught.value)!r}"


# -- the attack tests' surrogate: a small ViT trained by the real training code -------------------------------

# A one-block ViT over 4 patches: trains to ~85% on the mini digits in seconds on a CPU.
SURROGATE_OVERRIDES = [
    "model.name=vit_tiny_patch16_224", "+model.img_size=32", "+model.patch_size=16", "+model.embed_dim=64",
    "+model.depth=1", "+model.num_heads=1", "+model.global_pool=avg", "+model.class_token=false",
    "optim.backbone_lr=3e-3", "optim.head_lr=3e-3", "trainer.max_epochs=4",
]


def trained_surrogate(base: Path, mini_dir: Path) -> Path:
    """Train run dir of the test model, trained once under `base` by rgb.training (train.py's code path)."""
    from rgb.commands.train import train

    run_dir = base / "attack_run_surrogate" / "vit_mlp"
    if not (run_dir / "model.safetensors").is_file():
        train(compose_config("train", *SURROGATE_OVERRIDES, f"paths.mini_dir={mini_dir}", f"run_dir={run_dir}"))
    return run_dir


def head_of_test_split(mini_dir: Path, out: Path, n: int) -> Path:
    """A snapshot holding only the first n mini test images: same format, a fraction of the attack time."""
    import datasets

    from rgb.data import load_split
    from rgb.data.mini import CLASS_NAMES, DATASET
    from rgb.data.snapshot import write_readme, write_split

    if not (out / "README.md").is_file():
        test = load_split(str(mini_dir), DATASET, "test").select(range(n))
        columns = test.cast_column("image", datasets.Image(decode=False))[:]
        columns["image"] = [image["bytes"] for image in columns["image"]]
        write_split(out / "data" / DATASET / "test.parquet", CLASS_NAMES, columns)
        write_readme(out, "first test images of the mini benchmark")
    return out


# -- attack invariants ----------------------------------------------------------------------------------------


def assert_attack_invariants(model, x, y, x_adv, fooled, norm, eps):
    """Spec §8.3: flags match the model on x_adv, no NaN, in [0,1], within budget, unfooled points untouched."""
    from rgb.attacks.autoattack import within_budget

    assert torch.all((model(x_adv).argmax(dim=1) != y) == fooled)
    assert not torch.isnan(x_adv).any()
    assert torch.all((x_adv >= 0) & (x_adv <= 1))
    assert torch.all(within_budget(x_adv - x, norm, eps))
    assert torch.equal(x_adv[~fooled], x[~fooled])


# -- evaluation: records, pools and attack runs as attack.py writes them ----------------------------------------


def datamodule(mini_dir, **budgets):
    """The mini benchmark at its card's 32x32 budgets (`budgets` replaces some: another protocol)."""
    from rgb.data import BenchmarkData
    from rgb.data.resolvers import budgets as card_budgets

    return BenchmarkData(source=str(mini_dir), dataset="digits", image_size=32, num_classes=10,
                         budgets={**card_budgets("white_box", 32), **budgets}, eval_batch_size=128)


def white_box_settings(values):
    """The five white-box settings at the given accuracies over 100 images (None: missing)."""
    from rgb.evaluation.records import WHITE_BOX_SETTINGS, Accuracy

    return {s: (Accuracy(round(v * 100), 100) if v is not None else None) for s, v in zip(WHITE_BOX_SETTINGS, values)}


def card_protocol(dataset, image_size=224, **budgets):
    """The card's protocol for `dataset` stored at `image_size` (a dataset the card lacks is taken as stored at
    that size); `budgets` replaces some of the card's (norm key -> eps)."""
    from rgb.data.protocol import Protocol
    from rgb.data.resolvers import budgets as card_budgets

    return Protocol(dataset, image_size, image_size, {**card_budgets("white_box", image_size), **budgets})


def record(model, dataset, values, **fields):
    """A scores record with the given five white-box accuracies (None: missing), under the card's protocol."""
    from rgb.evaluation.records import ModelIdentity, ProtocolScore, ScoresRecord

    fields.setdefault("protocol", card_protocol(dataset))
    return ScoresRecord(
        model=ModelIdentity(model, "timm", "t", "ce", "fft", "0"), dataset=dataset, source="s", n_test=100, eps={},
        white_box=ProtocolScore("white_box", white_box_settings(values)), common_by_corruption={}, class_wise={},
        attacks={}, **fields,
    )


def save_pool(records, root: Path) -> None:
    for r in records:
        folder = root / r.dataset / r.model.run_name
        folder.mkdir(parents=True)
        r.save(folder / "scores.json")


def expectation(run: Path, dm, clean_pred):
    from rgb.core.files import file_sha256
    from rgb.data.fingerprint import split_sha256
    from rgb.evaluation.model_eval import AttackExpectation

    return AttackExpectation(file_sha256(run / "model.safetensors"), "digits", split_sha256(dm.split("test")),
                             dm.budgets, 200, clean_pred)


def write_attack(folder: Path, norm: str, run: Path, dm, robust, clean_pred, **overrides):
    """A merged attack run as attack.py writes it (results.parquet + summary.json of rgb.runs.store): the model's
    clean predictions, and `robust` among the images it classifies correctly."""
    from rgb.attacks.options import AttackOptions
    from rgb.attacks.registry import VERSIONS
    from rgb.core.files import file_sha256
    from rgb.data.fingerprint import split_sha256
    from rgb.runs.store import RunDirectory, RunSummary

    n = len(robust)
    labels = dm.split("test").labels[:n]
    pred = torch.as_tensor(clean_pred[:n])
    clean_correct = pred == labels
    robust = torch.as_tensor(np.asarray(robust, dtype=bool)) & clean_correct
    columns = {
        "image_id": torch.arange(n), "label": labels, "clean_pred": pred, "clean_correct": clean_correct,
        "adv_pred": torch.where(robust, labels, (labels + 1) % 10), "robust": robust,
        "fooled_by": torch.where(robust, -1, torch.where(clean_correct, 1, 0)), "perturbation_norm": torch.zeros(n),
        "forward_rows": torch.ones(n, dtype=torch.float64), "backward_rows": torch.ones(n, dtype=torch.float64),
    }
    store = RunDirectory(folder / norm, {"n_images": n, "batch_size": n})
    store.directory.mkdir(parents=True, exist_ok=True)
    fields = dict(
        run=str(run), run_name=run.name, weights_sha256=file_sha256(run / "model.safetensors"), model_family="timm",
        model_name="test_resnet", loss="ce", strategy="full_finetune", dataset="digits", source=str(dm.source),
        split="test", split_sha256=split_sha256(dm.split("test")), n=n, norm=norm, eps=dm.budgets[norm],
        impl="ours", impl_version="0", standard=True, attacks=list(VERSIONS["standard"].attacks),
        tf32=False, compile=False, channels_last=False, batch_size=n, threads=1,
        clean_accuracy=float(clean_correct.float().mean()), n_clean_correct=int(clean_correct.sum()),
        robust_accuracy=float(robust.float().mean()), n_robust=int(robust.sum()),
        accuracy_after={"clean": float(clean_correct.float().mean()), "apgd-ce": 0.05, "apgd-t": 0.04,
                        "fab-t": 0.04, "square": float(robust.float().mean())},
        attack_seconds=1.0, forward_rows_per_image=1.0, backward_rows_per_image=1.0,
        results_sha256=store.write_results(columns), versions={}, complete=True,
    )
    fields.update(overrides)
    store.write_summary(RunSummary.recording(AttackOptions(), **fields))  # the options' defaults, unless overridden
    return int(robust.sum())


@contextmanager
def serving(server, timeout_s: float = 20) -> Iterator:
    """An rgb.serve ModelServer (bound on 127.0.0.1) serving in a thread of this process until the block ends."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=timeout_s)


@contextmanager
def asgi_on_localhost(app, timeout_s: float = 10) -> Iterator[str]:
    """An ASGI app (a stand-in endpoint) served by uvicorn on 127.0.0.1 (any free port) in a thread of this process
    until the block ends; yields its base URL (`http://127.0.0.1:PORT/v1`)."""
    import socket
    import time

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


def wandb_records(folder: Path) -> list:
    """Every record of the offline runs under `folder`, parsed by wandb's own protobuf (`wandb.proto`
    wandb_internal_pb2.Record) from the `.wandb` transaction logs. wandb 0.31 dropped its Python scanner
    (wandb.sdk.internal.datastore); the LevelDB-log framing it read is kept here: a 7-byte `:W&B` header, then
    32 KiB blocks of chunks (crc32 4 bytes, length 2, type 1: full 1, first 2, middle 3, last 4)."""
    import struct

    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()  # flush and close the runs still open
    records = []
    for file in sorted(folder.rglob("*.wandb")):
        data = file.read_bytes()
        assert data[:4] == b":W&B", file
        offset, pending = 7, b""
        while offset + 7 <= len(data):
            if 32768 - offset % 32768 < 7:  # a block's tail too short for a chunk header is padding
                offset += 32768 - offset % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
            if kind == 0:
                break
            pending += data[offset + 7:offset + 7 + length]
            offset += 7 + length
            if kind in (1, 4):
                records.append(wandb_internal_pb2.Record.FromString(pending))
                pending = b""
    return records
