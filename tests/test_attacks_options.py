"""AttackOptions: validated once, and what each field is to the rest of the suite comes from its declaration."""

from __future__ import annotations

import typing
from dataclasses import MISSING, fields

import pytest

from rgb.attacks.options import ALWAYS, WHEN_SET, AttackOptions
from rgb.runs.store import RunSummary


@pytest.mark.parametrize("values, message", [
    ({"version": "best"}, "version must be one of"),
    ({"attacks": ["square", "pgd"]}, "attacks of version 'standard' must be a non-empty subset"),
    ({"attacks": []}, "must be a non-empty subset"),
    ({"precision": "fp16"}, "precision must be one of"),
    ({"steps": 0}, "steps must be an integer >= 1, got 0"),
    ({"tail_rows": -1}, "tail_rows must be an integer >= 0, got -1"), ({"seed": "3"}, "seed must be an integer"),
    ({"input_format": "nhwc"}, "input_format must be one of"),
    ({"capture": "script"}, "capture must be one of"),
    ({"capture": "trace", "precision": "bf16"}, "capture='trace' needs precision='fp32'"),
])
def test_bad_options_are_one_line_value_errors(values, message):
    with pytest.raises(ValueError, match=message) as caught:
        AttackOptions(**values)
    assert "\n" not in str(caught.value)


def test_identity_keeps_the_legacy_keys_and_adds_set_options_only():
    default = AttackOptions()
    assert default.identity(ALWAYS) == {"version": "standard", "seed": 0, "attacks": None, "precision": "fp32"}
    assert default.identity(WHEN_SET) == {} and default.off_protocol() == []
    tuned = AttackOptions(attacks=["apgd-ce"], steps=10, tail_rows=64, capture="eager")
    assert tuned.identity(ALWAYS)["attacks"] == ["apgd-ce"]
    assert tuned.identity(WHEN_SET) == {"steps": 10, "tail_rows": 64}  # capture changes float rounding only
    assert tuned.off_protocol() == ["steps"]


def test_cascade_inputs_follow_the_fields():
    inputs = AttackOptions(seed=3, steps=7, queries=9, tail_rows=2).cascade_inputs("apgd-ce")
    assert inputs == {"generator": 3, "n_iter": 7, "n_queries": 9, "tail_rows": 2}


def test_summary_writes_set_options_after_the_schema_and_reads_them_back():
    options = set(AttackOptions.names())
    hints = typing.get_type_hints(RunSummary)
    placeholder = {str: "x", bool: False, int: 0, float: 0.0, list: [], dict: {}}  # only the keys matter here
    values = {f.name: placeholder[typing.get_origin(hints[f.name]) or hints[f.name]] if hints[f.name] in placeholder
              or typing.get_origin(hints[f.name]) in placeholder else None
              for f in fields(RunSummary) if f.default is MISSING and f.default_factory is MISSING
              and f.name not in options}
    record = RunSummary.recording(AttackOptions(steps=10), attacks=["apgd-ce"], **values).to_json()
    assert list(record)[-4:] == ["tail_rows", "input_format", "capture", "steps"] and record["steps"] == 10
    assert record["attacks"] == ["apgd-ce"] and record["version"] == "standard"
    assert RunSummary.from_json(record).to_json() == record
    default = RunSummary.recording(AttackOptions(), attacks=["apgd-ce"], **values).to_json()
    assert list(default)[-1] == "capture" and "options" not in default and "steps" not in default


def test_fab_steps_reach_fab_only_and_default_to_steps():
    tuned = AttackOptions(steps=50, fab_steps=20)
    assert tuned.cascade_inputs("fab-t")["n_iter"] == tuned.cascade_inputs("fab")["n_iter"] == 20
    assert tuned.cascade_inputs("apgd-t")["n_iter"] == 50
    assert AttackOptions(steps=50).cascade_inputs("fab-t")["n_iter"] == 50
    assert tuned.identity(WHEN_SET) == {"steps": 50, "fab_steps": 20} and tuned.off_protocol() == ["steps", "fab_steps"]
    with pytest.raises(ValueError, match="fab_steps must be null or an integer >= 1, got 0"):
        AttackOptions(fab_steps=0)


def test_tf32_and_cudnn_benchmark_rules():
    """tf32 is a precision: in the identity, never the protocol's number; cudnn's benchmark mode rounds only."""
    tf32 = AttackOptions(precision="tf32", capture="trace")  # a trace follows TF32 flags (no autocast)
    assert tf32.identity(ALWAYS)["precision"] == "tf32"
    from rgb.runs.store import standard_run

    assert not standard_run("standard", list(tf32.attacks or ["apgd-ce", "apgd-t", "fab-t", "square"]), "tf32")
    benchmark = AttackOptions(cudnn_benchmark=True)
    assert benchmark.identity(WHEN_SET) == {} and benchmark.off_protocol() == []
    with pytest.raises(ValueError, match="cudnn_benchmark must be true or false"):
        AttackOptions(cudnn_benchmark="yes")


def test_a_summary_of_a_trained_model_reads_back_its_loss_config():
    """A train run's model.json holds its loss as a config object ({"name": "ce"}), which summary.json copies: the
    strict reader reads it back (make demo's evaluate.py refused it once)."""
    hints = typing.get_type_hints(RunSummary)
    placeholder = {str: "x", bool: False, int: 0, float: 0.0, list: [], dict: {}}
    values = {f.name: placeholder.get(typing.get_origin(hints[f.name]) or hints[f.name]) for f in fields(RunSummary)
              if f.default is MISSING and f.default_factory is MISSING and f.name not in AttackOptions.names()}
    record = RunSummary.recording(AttackOptions(), attacks=["apgd-ce"], **{**values, "loss": {"name": "ce"}}).to_json()
    assert RunSummary.from_json(record).loss == {"name": "ce"}
