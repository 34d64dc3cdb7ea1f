"""The run store's vocabulary, written once: output paths, the standardness rule, the `fooled_by` code, and
the attack-run request built from plain values (no config) as rgb.benchmark builds it."""

import functools
import pickle
from pathlib import Path

import pytest
import torch

from rgb.attacks import VERSIONS
from rgb.attacks.autoattack import FooledBy
from rgb.core.values import ConfigValueError
from rgb.data import BenchmarkData
from rgb.runs.request import AttackRequest, white_box_budgets
from rgb.runs.store import (
    REFERENCE_CASCADE,
    AttackRunError,
    budget_dir,
    first_images_dir,
    output_dir_for,
    partial_dir,
    standard_run,
    sweep_dir_for,
)


def test_output_dirs_have_one_layout():
    assert output_dir_for("out", "attack", "flowers-102", "vit") == Path("out/attack/flowers-102/vit")
    assert output_dir_for("out", "eval", "digits", "hf-hub_timm--vit") == Path("out/eval/digits/hf-hub_timm--vit")
    with pytest.raises(ConfigValueError):
        output_dir_for("out", "eval", "digits", "../elsewhere")  # a run name is one directory
    with pytest.raises(ValueError, match="output kind must be one of"):
        output_dir_for("out", "scores", "digits", "vit")


def test_the_dirs_inside_the_outputs_have_one_layout():
    """The names on disk of a threat model's run, rgb.benchmark's first-n run, a `runs=` sweep and a PARTIAL
    evaluation (old run dirs stay readable)."""
    attack = output_dir_for("out", "attack", "digits", "vit")
    assert budget_dir(attack, "linf") == Path("out/attack/digits/vit/linf")
    assert budget_dir(first_images_dir(attack, 50), "l2") == Path("out/attack/digits/vit/first-50/l2")
    assert sweep_dir_for("out", "digits", "m-ce") == Path("out/attack/digits/multirun/m-ce")
    assert str(sweep_dir_for("${paths.output_dir}", "${data.dataset}", "m")) == (
        "${paths.output_dir}/attack/${data.dataset}/multirun/m")  # as attack.py `runs=` spells it
    assert partial_dir(output_dir_for("out", "eval", "digits", "vit")) == Path("out/eval/digits/vit/partial")


def test_the_configs_spell_output_dirs_through_the_store(tmp_path, compose):
    """attack.yaml's and evaluate.yaml's output paths are the store's layout (the `${rgb.output_dir:...}` resolver)."""
    attack = compose("attack", f"run={tmp_path / 'demo'}", f"paths.output_dir={tmp_path}")
    evaluate = compose("evaluate", f"run={tmp_path / 'demo'}", f"paths.output_dir={tmp_path}")
    assert Path(attack.output_dir) == output_dir_for(tmp_path, "attack", "digits", "demo")
    assert Path(evaluate.attack_dir) == Path(attack.output_dir)
    assert Path(evaluate.output_dir) == output_dir_for(tmp_path, "eval", "digits", "demo")
    assert attack.export_dir == f"{attack.output_dir}/adversarial" and attack.sweep_dir == f"{attack.output_dir}/multirun"


def test_standard_is_the_whole_cascade_of_a_standard_version_in_fp32():
    cascade = list(VERSIONS["standard"].attacks)
    assert standard_run("standard", cascade, "fp32")
    assert standard_run("standard", [REFERENCE_CASCADE], "fp32")  # the reference's cascade, reported as one
    assert not standard_run("standard", cascade, "bf16")
    assert not standard_run("standard", cascade[:2], "fp32")
    assert not standard_run("standard", cascade[::-1], "fp32")
    assert not standard_run("plus", list(VERSIONS["plus"].attacks), "fp32")
    assert not standard_run("no-such-version", cascade, "fp32")


def test_fooled_by_code():
    fooled_by = torch.tensor([FooledBy.ROBUST, FooledBy.CLEAN_WRONG, 1, 2, 4])
    assert FooledBy.correct_after(fooled_by, 0).tolist() == [True, False, True, True, True]  # the clean pass
    assert FooledBy.correct_after(fooled_by, 2).tolist() == [True, False, False, False, True]
    assert FooledBy.correct_after(fooled_by, 4).tolist() == [True, False, False, False, False]


def test_attack_settings_from_plain_values_are_validated_and_picklable(tmp_path):
    run = tmp_path / "vit.safetensors"
    run.write_bytes(b"")
    data = functools.partial(BenchmarkData.for_dataset, "digits", str(tmp_path / "mini"))
    module = data()
    budgets = white_box_budgets(["linf", "L2"], module.budgets, module.transfer_budgets)
    assert [b.name for b in budgets] == ["linf", "l2"] and budgets[0].export_split == "linf_4"
    settings = AttackRequest.create(run, data, budgets, batch_size=50, output_dir=tmp_path / "out", surrogate="m",
                                     devices=2, threads=2)
    again = pickle.loads(pickle.dumps(settings))  # it travels to spawned workers, which build their own data module
    assert again.data().budgets == module.budgets and again.processes == 2 and again.run_name == "vit"
    assert again.export_dir == tmp_path / "out" / "adversarial"
    for bad, message in [(dict(batch_size=0), "batch_size must be auto or an integer >= 1, got 0"),
                         (dict(batch_size="big"), "batch_size must be auto or an integer >= 1, got .big."),
                         (dict(impl="theirs"), "impl must be one of"),
                         (dict(shard_index=2, shard_count=2), r"shard.index must be in \[0, shard.count\)")]:
        with pytest.raises(AttackRunError, match=message):
            AttackRequest.create(run, data, budgets, **{"batch_size": 50, "output_dir": tmp_path, "surrogate": "m",
                                                          **bad})
    with pytest.raises(AttackRunError, match="does not exist"):
        AttackRequest.create(tmp_path / "absent", data, budgets, batch_size=50, output_dir=tmp_path, surrogate="m")
    with pytest.raises(AttackRunError, match="norms must be distinct names"):
        white_box_budgets(["linf", "Linf"], module.budgets, module.transfer_budgets)
