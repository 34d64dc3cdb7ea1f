"""The error contract (issue 45, item 6): what a user can cause raises a `UserError` subclass (rgb/core/errors.py)
that keeps the builtin base (`class X(UserError, ValueError)`), so `except ValueError` still catches it and the
commands print it as one line. A lint holds rgb/ to it: no bare `raise ValueError/RuntimeError/TypeError(...)`
except at the sites of INTERNAL, each with why it is not the user's to cause; and USER_ERRORS holds the calls a user
makes that once raised a bare builtin to a one-line UserError of that builtin."""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers import RGB, raises_one_line
from rgb.attacks import AutoAttack
from rgb.commands import main as cli
from rgb.core.errors import UserError
from rgb.core.threat import parse_norm
from rgb.data.benchmark_data import BenchmarkData
from rgb.data.corruptions import apply_corruption, corruption_of_row
from rgb.data.layout import split_file
from rgb.data.protocol import card_image_size
from rgb.data.snapshot import clean_columns, snapshot_shape, write_split
from rgb.models import create_model, export_factory_model, export_model
from rgb.models.user_factory import resolve_factory
from rgb.training.losses import build_loss
from rgb.training.optim import build_optimizer
from rgb.training.request import ModelSection
from rgb.training.zeroshot import initialise_head

BARE = {"ValueError", "RuntimeError", "TypeError"}

_ATTACK_ARGS = ("the pure-PyTorch attacks' arguments (tensor shapes, eps, iteration counts) checked for a Python "
                "caller; the commands reach them only with values AttackOptions and the schema refused first")
_METRIC_ARGS = "rank metrics over arrays rgb builds itself (ks and p are checked by evaluate's schema first)"
# "path::function" -> why a bare raise there is an internal invariant (or a caller's programming error).
INTERNAL = {
    **{f"rgb/attacks/apgd.py::{f}": _ATTACK_ARGS for f in ("_check_targeted_classes", "apgd", "apgd_over_targets")},
    **{f"rgb/attacks/square.py::{f}": _ATTACK_ARGS for f in ("square", "square_pattern")},
    **{f"rgb/attacks/fab.py::{f}": _ATTACK_ARGS
       for f in ("_check_hyperplane_args", "_clean_logits", "_validate", "fab_untargeted")},
    **{f"rgb/attacks/autoattack.py::AutoAttack.{f}": _ATTACK_ARGS for f in ("_step_params",)},
    **{f"rgb/attacks/common.py::{f}": _ATTACK_ARGS
       for f in ("EvalCounter.per_image", "check_eps", "per_sample", "runner_up_targets")},
    "rgb/attacks/losses.py::dlr_loss": _ATTACK_ARGS,
    "rgb/attacks/losses.py::targeted_dlr_loss": _ATTACK_ARGS,
    "rgb/attacks/malt.py::malt_targets": _ATTACK_ARGS,
    "rgb/attacks/projections.py::project_l1_ball_box": _ATTACK_ARGS,
    "rgb/attacks/registry.py::AttackEntry.__post_init__": "the attack table's own entries (rgb's code, not input)",
    "rgb/attacks/registry.py::Step.__post_init__": "the attack table's own entries (rgb's code, not input)",
    **{f"rgb/brittleness/metrics.py::{f}": _METRIC_ARGS
       for f in ("_as_batch", "_check_p", "_normalise", "_positions", "classification_view", "inter_distance",
                 "overlap_at_k", "overlap_counts", "query_table", "summarize", "text_distance")},
    "rgb/core/classwise.py::class_wise_summary": "an empty split: the data loader never yields one",
    "rgb/data/resolvers.py::budgets": "the budget kind is the configs' own resolver argument, not typed by users",
    "rgb/evaluation/records.py::Accuracy.__post_init__": "counts rgb computed (correct <= total)",
    "rgb/runs/pooled.py::PooledShard.chunks": "the pooled schedule's own stage order",
    "rgb/runs/store.py::output_dir_for": "the output kind is the code's (attack, eval, ...), never a user value",
    "rgb/training/losses.py::FARE.__call__": "TypeError: FARE is called through compute() by the module itself",
    "rgb/training/module.py::RobustFinetuneModule.__init__": "strategy.name is refused first by the train schema "
                                                             "(rgb.commands.train_config.RULES)",
    "rgb/training/module.py::RobustFinetuneModule.configure_optimizers": "optim.scheduler is refused first by the "
                                                                         "train schema (rgb.commands.train_config.RULES)",
    "rgb/training/rundir.py::AtomicCheckpointIO.save_checkpoint": "TypeError: Lightning's CheckpointIO contract",
    "rgb/zeroshot/report.py::comparison_table": "templates and features rgb built together",
}


def bare_raises() -> list[str]:
    """"path::function" (dotted through classes) of every `raise ValueError/RuntimeError/TypeError(...)` in rgb/."""
    found = []

    def walk(node, where: str, path: str):
        for child in ast.iter_child_nodes(node):
            named = getattr(child, "name", None) if isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
            if (isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call)
                    and isinstance(child.exc.func, ast.Name) and child.exc.func.id in BARE):
                found.append(f"{path}::{where}")
            walk(child, ".".join(filter(None, (where, named))) if named else where, path)

    for file in sorted(RGB.rglob("*.py")):
        path = str(file.relative_to(RGB.parent))
        walk(ast.parse(file.read_text(), filename=path), "", path)
    return found


def test_no_bare_value_runtime_or_type_error_where_a_user_can_cause_it():
    unlisted = sorted({site for site in bare_raises() if site not in INTERNAL})
    assert unlisted == [], ("raise a UserError subclass (keeping the builtin base) where a user can cause it, or list "
                            f"the site in INTERNAL with why it is not: {unlisted}")


def test_every_listed_site_still_raises_bare():
    """A converted site leaves the list: it only names what is there."""
    sites = set(bare_raises())
    assert sorted(site for site in INTERNAL if site not in sites) == []


# -------------------------------------------------------------- the calls a user makes that once raised a bare builtin


class ViewsItsInput(nn.Module):
    """Logits from `.view` of the input, which an NHWC copy refuses."""

    def forward(self, x):
        return x.view(len(x), -1)[:, :10]


def hooked() -> nn.Module:
    """A model with a forward hook, which a trace would skip."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10)).eval()
    model[1].register_forward_hook(lambda module, inputs, output: None)
    return model


def attacked(model: nn.Module, **options):
    """AutoAttack of `model` on 4 images it classifies right (so the attacks do call it)."""
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x).argmax(1)
    return AutoAttack(model, "Linf", 0.03, attacks=["apgd-ce"], **options).run(x, y)


def non_square_snapshot(root: Path, dataset: str = "odd") -> Path:
    """A snapshot whose test split holds one 8x6 image, written by the suite's snapshot writer."""
    write_split(split_file(root, dataset, "test"), ["a", "b"], clean_columns(np.zeros((1, 6, 8, 3), np.uint8),
                                                                            np.array([0])))
    return root


def frozen_model() -> nn.Module:
    return create_model("test_resnet", num_classes=2, pretrained=False).requires_grad_(False)


# (the call, given tmp_path and a fixture getter; the builtin it raised before; what its one line says)
USER_ERRORS = {
    "rgb/attacks/model_calls.py::_captured": (
        lambda tmp, fixture: attacked(hooked(), capture="trace"), ValueError,
        "capture='trace': the model has a forward hook .* use capture='auto' or 'eager'"),
    "rgb/attacks/model_calls.py::_formatted": (
        lambda tmp, fixture: attacked(ViewsItsInput(), input_format="channels_last", capture="eager"),
        ValueError, "input_format='channels_last': the model refuses NHWC inputs .* use input_format='auto' or "
                    "'contiguous'"),
    "rgb/data/benchmark_data.py::BenchmarkData.class_names": (
        lambda tmp, fixture: BenchmarkData(fixture("mini_dir"), "digits", 32, 3, {}).class_names, ValueError,
        "data.num_classes=3 but digits in .* has 10 classes: set data.num_classes=10"),
    "rgb/data/corruptions.py::apply_corruption": (
        lambda tmp, fixture: apply_corruption(np.zeros((8, 8, 3), np.uint8), "fog2", 3, 0), ValueError,
        "unknown corruption 'fog2'; available: shot_noise, "),
    "rgb/data/corruptions.py::corruption_of_row": (
        lambda tmp, fixture: corruption_of_row(0, 5), ValueError,
        "a common split needs at least 11 test images .* got 5: add test images"),
    "rgb/data/protocol.py::card_image_size": (
        lambda tmp, fixture: card_image_size("pets3"), ValueError,
        "dataset 'pets3' is none of the card's .* give its snapshot folder"),
    "rgb/data/snapshot.py::snapshot_shape": (
        lambda tmp, fixture: snapshot_shape(non_square_snapshot(tmp), "odd"), ValueError,
        "images are 8x6, the benchmark's are square: write the snapshot with python -m rgb.data.import_folder"),
    "rgb/models/families.py::family_of": (
        lambda tmp, fixture: export_model(nn.Linear(2, 2), tmp, {}), ValueError,
        "Linear belongs to no model family: export it with rgb.models.export_factory_model"),
    "rgb/models/hub.py::split_source": (
        lambda tmp, fixture: create_model("hf-hub:", num_classes=2), ValueError,
        "model name 'hf-hub:' names no repo or folder after 'hf-hub:': write hf-hub:ORG/NAME"),
    "rgb/models/io.py::export_factory_model": (
        lambda tmp, fixture: export_factory_model(nn.Linear(2, 2), tmp, "torch.nn:Linear", {"in_features": 3,
                                                                                            "out_features": 2}),
        ValueError, "factory 'torch.nn:Linear' with kwargs .* give the factory and kwargs that build this model"),
    "rgb/training/optim.py::build_optimizer": (
        lambda tmp, fixture: build_optimizer(frozen_model(), 1e-3, 1e-3, 0.0, 0.0), ValueError,
        "the model has no trainable parameters: every one has requires_grad=False .* use strategy=full_finetune"),
    "rgb/training/zeroshot.py::initialise_head": (
        lambda tmp, fixture: initialise_head(None, ModelSection(build=frozen_model, head_init="bogus"), None),
        ValueError, "unknown head_init 'bogus'; choose one of zeroshot"),
    # made user errors before the lint: a model, a factory spec, a loss and a norm a user names
    "rgb/models/factory.py::check_model_name": (
        lambda tmp, fixture: create_model("resnet_does_not_exist", num_classes=2), ValueError, "unknown timm model"),
    "rgb/models/user_factory.py::resolve_factory": (
        lambda tmp, fixture: resolve_factory("no_colon"), ValueError, "must be 'module:function'"),
    "rgb/training/losses.py::build_loss": (
        lambda tmp, fixture: build_loss("crossentropy"), ValueError, "crossentropy"),
    "rgb/core/threat.py::parse_norm": (lambda tmp, fixture: parse_norm("l3"), ValueError, "l3"),
}


@pytest.mark.parametrize("site", USER_ERRORS)
def test_what_a_user_can_cause_is_a_one_line_user_error_of_its_builtin_type(site, tmp_path, request):
    call, builtin, message = USER_ERRORS[site]
    with raises_one_line(UserError, match=message) as caught:
        call(tmp_path, request.getfixturevalue)
    assert isinstance(caught.value, builtin)


def test_a_non_square_snapshot_is_the_commands_one_line(tmp_path):
    """data=custom reads the snapshot's image size while the command composes its config: the line shown is the
    error's own, not Hydra's interpolation report around it."""
    root = non_square_snapshot(tmp_path / "snapshot")
    shown = cli._compose_error("train", ["data=custom", f"data.source={root}", "data.dataset=odd",
                                         f"paths.output_dir={tmp_path / 'out'}"])
    assert shown == (f"{root}/data/odd/test.parquet: images are 8x6, the benchmark's are square: write the snapshot "
                     "with python -m rgb.data.import_folder (it resizes them to --size x --size)")
