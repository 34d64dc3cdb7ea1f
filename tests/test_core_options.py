"""One way to declare an option (rgb.core.options): a ruled field read by field name, its rule checked when made and
spread into its command's schema, its identity declared on it."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from rgb.core.options import Ruled, ruled, section
from rgb.core.values import BOOL, POSITIVE_INT, ConfigValueError, optional

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Inner(Ruled):
    every: int = ruled(1, POSITIVE_INT)
    fast: bool = ruled(False, BOOL, key="fast", identity=False)


COUNT = optional(POSITIVE_INT)


@dataclass(frozen=True)
class Outer(Ruled):
    built: object
    where: Path | None = ruled(None, convert=Path)
    count: int | None = ruled(None, COUNT)
    inner: Inner = section(Inner)

    def __post_init__(self):
        self.check()


def test_a_ruled_type_reads_its_keys_by_field_name_and_names_its_rules_and_identity():
    assert Outer.rules() == {"count": COUNT, "inner.every": POSITIVE_INT, "fast": BOOL}
    assert Outer.keys() == ("where", "count", "inner.every", "fast")
    assert Outer.keys(identity=False) == ("fast",)
    made = Outer.from_config({"where": "a/b", "count": 3, "inner": {"every": 2}, "fast": True, "other": 1},
                             built="x")
    assert made == Outer("x", Path("a/b"), 3, Inner(2, True))
    assert Outer.from_config({}, built=None) == Outer(None)  # an absent key keeps its default


def test_a_value_outside_its_rule_is_one_line_naming_its_key():
    with pytest.raises(ConfigValueError, match=r"^count must be null or an integer >= 1, got 0$"):
        Outer.from_config({"count": 0}, built=None)
    assert Inner(every=0).problems("inner.") == ["inner.every must be an integer >= 1, got 0"]
    with pytest.raises(ConfigValueError, match=r"^inner.every must be an integer >= 1, got 0$"):  # its sections' too
        Outer(None, inner=Inner(every=0))
    assert Outer(None, inner={"every": 4}).inner == Inner(4)  # a section given as its mapping becomes its type


def test_every_option_type_is_ruled_and_rules_and_names_are_defined_once():
    from rgb.attacks.options import AttackOptions
    from rgb.endpoints.client import RequestCaps
    from rgb.endpoints.settings import ClientSettings, EndpointSettings
    from rgb.evaluation.request import EvalRequest
    from rgb.evaluation.text_robustness import TextRobustnessOptions
    from rgb.serve.request import Faults, Limits, ServeRequest
    from rgb.training import request as train
    from rgb.training.robust_val import RobustValSettings
    from rgb.zeroshot.head import PromptSettings

    types = (AttackOptions, RequestCaps, EvalRequest, TextRobustnessOptions, ServeRequest, Limits, Faults,
             RobustValSettings, train.TrainRequest, train.DataSection, train.ModelSection, train.LossSection,
             train.StrategySection, train.OptimSection, train.TrainerSection, train.LoggingSection,
             EndpointSettings, ClientSettings, PromptSettings)
    assert all(issubclass(kind, Ruled) for kind in types)
    defined = [f"{path.relative_to(REPO)}: {line.strip()}" for path in sorted((REPO / "rgb").rglob("*.py"))
               for line in path.read_text().splitlines()
               if line.strip().startswith(("def rules(", "def names(cls"))]
    assert defined == ["rgb/core/options.py: def rules(cls, prefix: str = \"\") -> dict[str, Rule]:",
                       "rgb/core/options.py: def names(cls) -> tuple[str, ...]:"]


def test_each_commands_schema_spreads_the_rules_of_the_types_it_builds():
    from rgb.attacks.options import AttackOptions
    from rgb.commands.schema import command_schema
    from rgb.evaluation.request import EvalRequest
    from rgb.evaluation.text_robustness import TextRobustnessOptions
    from rgb.serve.request import ServeRequest
    from rgb.training.request import TrainRequest
    from rgb.training.robust_val import KEY, RobustValSettings
    from rgb.endpoints.settings import PREFIX, ClientSettings, EndpointSettings
    from rgb.zeroshot.settings import KEY as PROMPTS
    from rgb.zeroshot.head import PromptSettings

    built = {"attack": AttackOptions.rules(), "serve": ServeRequest.rules(),
             "evaluate": {**EvalRequest.rules(), **TextRobustnessOptions.rules("text_robustness_options.")},
             "train": {**TrainRequest.rules(), **RobustValSettings.rules(KEY), **PromptSettings.rules(PROMPTS),
                       **EndpointSettings.rules(PREFIX), **ClientSettings.rules(PREFIX)}}
    for command, rules in built.items():
        schema = command_schema(command)
        assert rules.keys() <= schema.keys(), command
        # the commands narrow or widen two: rgb-serve's run= must be given (the request's may be None for a model
        # handed over in Python), train's strategies add the record-only ones (model=api_chat)
        assert all(schema[key] is rule for key, rule in rules.items() if key not in ("run", "strategy.name")), command


def test_train_identity_keys_are_declared_on_their_fields_and_unchanged():
    from rgb.commands.train_config import RESUMABLE_KEYS

    # the typed request's resumable keys, and the config-level patterns: together the set every run's identity
    # (run.json, the pinned demo identities) was computed without
    assert {"run_dir", "ckpt_path", "threads", "channels_last", "compile", "callbacks.robust_val.batch_size"} <= set(
        RESUMABLE_KEYS)
    assert set(RESUMABLE_KEYS) - {"wandb.log_weights"} == {
        "run_name", "sweep_name", "run_dir", "ckpt_path", "threads", "channels_last", "compile", "paths.*",
        "logger.*", "wandb.*", "model_card", "card.*", "data._target_", "data.num_workers", "data.pin_memory",
        "data.cache_dir", "data.eval_batch_size", "prompts.cache_dir", "trainer.accelerator", "trainer.devices",
        "trainer.num_nodes", "trainer.strategy", "trainer.max_time", "trainer.default_root_dir",
        "trainer.log_every_n_steps", "trainer.enable_progress_bar", "trainer.enable_model_summary",
        "callbacks.progress_bar.*", "callbacks.*.dirpath", "callbacks.robust_val.batch_size"}


def test_the_endpoint_and_prompt_settings_declare_their_rules_on_their_fields():
    """No table of rules keyed by YAML path beside them: the fields hold the rules, a broken value is one line
    naming its key (a value where a secret may sit named, never shown), and the keys are the YAML's."""
    import rgb.endpoints.settings as settings
    from rgb.core.configs import config_dir
    from rgb.core.templates import PromptError
    from rgb.zeroshot.head import PromptSettings

    assert not [name for name in dir(settings) if name.endswith("_RULES")]
    rules = {**settings.EndpointSettings.rules("model."), **settings.ClientSettings.rules("model.")}
    import yaml
    assert {key.removeprefix("model.") for key in rules} <= set(yaml.safe_load(
        (config_dir() / "model" / "api_chat.yaml").read_text()))
    with pytest.raises(ConfigValueError, match=r"^invalid value: model.header_env must be a mapping of header: "
                                               r"environment variable name; model.max_retries must be an integer "
                                               r">= 0, got -1$"):
        settings.ClientSettings(max_retries=-1, header_env="sk-secret")
    assert PromptSettings.rules("prompts.").keys() == {"prompts.ensemble", "prompts.k", "prompts.tau",
                                                        "prompts.enrich_worst", "prompts.cmm_units", "prompts.mad_t"}
    with pytest.raises(PromptError, match=r"^prompts.k must be a fraction in \(0, 1\], got 2$"):
        PromptSettings(k=2)
