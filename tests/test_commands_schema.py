"""Each command's config schema (rgb.commands.schema): a mistake is one line naming the key and what it may be,
before any work; a key the YAML does not have is refused with the closest one it has; `--help` is the command's own
(issue 45, item 5)."""

import json
import sys
from types import SimpleNamespace

import pytest

from rgb.commands import main as cli
from rgb.commands import schema

COMMANDS = ("train", "attack", "evaluate", "transfer", "serve")


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "model.json").write_text(json.dumps({"dataset": "digits"}))
    return run


def _problem(config, *argv, out):
    problem = cli._compose_error(config, [*argv, f"paths.output_dir={out}"])
    assert problem is None or "\n" not in problem
    return problem


def test_a_pool_without_brackets_is_refused_not_iterated_by_character(tmp_path):
    (tmp_path / "eval").mkdir()
    problem = _problem("evaluate", f"pool={tmp_path / 'eval'}", out=tmp_path)
    assert problem.startswith("invalid value: pool must be null or a non-empty list ([a,b,...])")
    assert _problem("evaluate", f"pool=[{tmp_path / 'eval'}]", out=tmp_path) is None


def test_a_run_that_does_not_exist_is_named_before_any_work(tmp_path):
    for config in ("evaluate", "attack", "transfer", "serve"):
        problem = _problem(config, "run=does/not/exist", out=tmp_path)
        assert "run must be" in problem and "a run directory or exported .safetensors file that exists" in problem
        assert problem.endswith("got 'does/not/exist'")


@pytest.mark.parametrize("config, override, message", [
    ("evaluate", "protocol=blackbox", "protocol must be one of white_box, black_box, got 'blackbox'"),
    ("evaluate", "rank_by=mean", "rank_by must be one of borda, sum"),
    ("evaluate", "site=yes", "site must be true or false, got 'yes'"),
    ("evaluate", "text_robustness_options.types=[typo]", "text_robustness_options.types must be null or a non-empty"),
    ("evaluate", "zeroshot_report_options.cmm_units=logits", "zeroshot_report_options.cmm_units must be null or one "
                                                             "of logit, cosine"),
    ("attack", "norms=linf", "norms must be a non-empty list ([a,b,...]), each Linf, L2 or L1 (any case), got 'linf'"),
    ("attack", "norms=[linf,l3]", "norms must be a non-empty list"),
    ("attack", "schedule=pool", "schedule must be one of batch, pooled, pooled_by_need, got 'pool'"),
    ("attack", "precision=fp16", "precision must be one of fp32, tf32, bf16"),
    ("attack", "impl=theirs", "impl must be one of ours, reference"),
    ("transfer", "splits=linf_8", "splits must be null or a non-empty list"),
    ("serve", "port=70000", "port must be an integer from 0 (any free one) to 65535, got 70000"),
    ("serve", "limits.max_concurrency=0", "limits.max_concurrency must be an integer >= 1"),
    ("train", "optim.scheduler=linear", "optim.scheduler must be one of"),
])
def test_enums_lists_and_types_are_one_line_naming_the_allowed_values(config, override, message, run_dir, tmp_path):
    argv = [] if config == "train" else [f"run={run_dir}"]
    problem = _problem(config, *argv, override, out=tmp_path)
    assert problem is not None and message in problem


@pytest.mark.parametrize("config, override, message", [
    ("evaluate", "prtocol=black_box", "unknown key prtocol: evaluate's config has no such key; did you mean protocol?"),
    ("evaluate", "+prtocol=black_box", "unknown key prtocol: evaluate's config has no such key; did you mean protocol?"),
    ("attack", "shard.idx=1", "unknown key shard.idx: attack's config (under shard) has no such key; did you mean "
                              "shard.index?"),
    ("train", "+sed=1", "unknown key sed: train's config has no such key; did you mean seed?"),
    ("serve", "+zzz=1", "unknown key zzz: serve's config has no such key; its keys: api_key_env, batch_dir,"),
])
def test_unknown_keys_are_refused_with_the_closest_known_one(config, override, message, run_dir, tmp_path):
    argv = [] if config == "train" else [f"run={run_dir}"]
    problem = _problem(config, *argv, override, out=tmp_path)
    assert problem is not None and problem.startswith(message)


def test_keys_added_inside_a_section_and_group_choices_stay_allowed(run_dir, tmp_path):
    """Lightning's and timm's own keyword arguments (`+trainer.limit_train_batches=2`) are not the schema's to know."""
    assert _problem("train", "+trainer.limit_train_batches=2", "experiment=fft5_trades", out=tmp_path) is None


@pytest.mark.parametrize("command", COMMANDS)
def test_every_rule_names_a_key_of_the_commands_yaml(command, compose):
    """A renamed or removed key cannot leave a rule behind that checks nothing."""
    from omegaconf import OmegaConf

    from rgb.attacks.options import AttackOptions
    from rgb.core.values import flatten
    from rgb.endpoints.settings import PREFIX, ClientSettings, EndpointSettings

    cfg = compose(command, "data=mini") if command != "serve" else compose(command)
    keys = flatten(OmegaConf.to_container(cfg, resolve=False))
    # in some groups' options only (loss=trades, strategy=zeroshot, model=api_chat, callbacks=robust_val);
    # AttackOptions' rules for all it may be given
    endpoint = (*EndpointSettings.keys(PREFIX), *ClientSettings.keys(PREFIX), "model.check_endpoint")
    optional = ("loss.", "prompts.", *endpoint, "callbacks.robust_val.") if command == "train" else \
        AttackOptions.names() if command == "transfer" else ()
    dead = [key for key in schema.command_schema(command)
            if not any(k == key or k.startswith(key.removesuffix("*")) for k in keys) and not key.startswith(optional)]
    assert dead == []


def test_black_box_next_to_run_is_honoured_as_the_returned_score(run_dir, compose, monkeypatch):
    """protocol=black_box with run=: the black-box protocol is scored (as transfer=true) and is the sweepers'
    objective, never the white-box score."""
    from rgb.commands import evaluate as command

    record = SimpleNamespace(card_score={"white_box": 1.0, "black_box": 7.0}.get, white_box_na=None)
    asked = []
    monkeypatch.setattr("rgb.evaluation.run.evaluate", lambda request: asked.append(request) or (record, {}))
    assert command.run_evaluation(compose("evaluate", f"run={run_dir}", "protocol=black_box")) == 7.0
    assert asked[0].protocol == "black_box"
    assert command.run_evaluation(compose("evaluate", f"run={run_dir}")) == 1.0


def test_serve_help_shows_serves_options_not_trains(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["rgb-serve", "--help"])
    try:
        cli.serve_main()
    except SystemExit as stop:
        assert not stop.code
    shown = capsys.readouterr().out
    assert "port: 8000" in shown and "rgb-serve run=" in shown
    assert "loss:" not in shown and "model:" not in shown and "strategy:" not in shown
