"""The error contract as a lint (issue 45, item 6): rgb/ raises no bare ValueError / RuntimeError / TypeError
(`raise ValueError(...)`) except at the sites listed here, each with why it is not the user's to cause. What a user
can cause raises a `UserError` subclass (rgb/core/errors.py) that keeps the builtin base (`class X(UserError,
ValueError)`), so `except ValueError` still catches it and the commands print it as one line."""

import ast
from pathlib import Path

RGB = Path(__file__).resolve().parents[1] / "rgb"
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
# User-facing sites still to convert (named, so that the list only shrinks): "path::function" -> what a user did.
TO_CONVERT = {
    "rgb/attacks/model_calls.py::_captured": "capture=trace on a model that cannot be traced",
    "rgb/attacks/model_calls.py::_formatted": "input_format=channels_last on a model that refuses NHWC",
    "rgb/data/benchmark_data.py::BenchmarkData.class_names": "a snapshot without class names",
    "rgb/data/corruptions.py::apply_corruption": "an unknown corruption name",
    "rgb/data/corruptions.py::corruption_of_row": "a common split built from too few images",
    "rgb/data/protocol.py::card_image_size": "a dataset that is not the card's without its snapshot",
    "rgb/data/snapshot.py::snapshot_shape": "a snapshot of non-square images",
    "rgb/models/families.py::family_of": "a model.json naming an unknown family",
    "rgb/models/hub.py::split_source": "a hub model name without a repo",
    "rgb/models/io.py::export_factory_model": "a factory whose module does not match the model",
    "rgb/training/optim.py::build_optimizer": "a strategy that freezes every parameter",
    "rgb/training/zeroshot.py::initialise_head": "an unknown head_init",
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
    listed = {**INTERNAL, **TO_CONVERT}
    unlisted = sorted({site for site in bare_raises()
                       if site not in listed})
    assert unlisted == [], ("raise a UserError subclass (keeping the builtin base) where a user can cause it, or list "
                            f"the site in INTERNAL with why it is not: {unlisted}")


def test_every_listed_site_still_raises_bare():
    """A converted site leaves the lists: they only name what is there."""
    sites = set(bare_raises())
    assert sorted(site for site in {**INTERNAL, **TO_CONVERT} if site not in sites) == []


def test_the_user_facing_errors_of_models_losses_and_norms_are_user_errors():
    import pytest

    from rgb.core.errors import UserError
    from rgb.core.threat import parse_norm
    from rgb.models.factory import create_model
    from rgb.models.user_factory import resolve_factory
    from rgb.training.losses import build_loss

    for call in (lambda: create_model("resnet_does_not_exist", num_classes=2), lambda: resolve_factory("no_colon"),
                 lambda: build_loss("crossentropy"), lambda: parse_norm("l3")):
        with pytest.raises(UserError) as caught:
            call()
        assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)
