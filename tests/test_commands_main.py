"""What a user can get wrong on the command line (issue 19, items 12, 14, 17, 22): one line naming the problem,
never a traceback, and nothing written outside the output tree. Mostly in-process: the entry points' own checks."""

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from helpers import REPO, raises_one_line
from rgb.commands import main as cli
from rgb.core.files import replaced_whole
from rgb.core.values import ConfigValueError, path_name
from rgb.models import ExportFileError, create_model, export_model, load_with_meta



@pytest.fixture
def recorded_run(tmp_path):
    """A run dir whose model.json says it was trained on the mini data in a non-default directory."""
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "model.json").write_text(json.dumps({"dataset": "digits", "data_source": str(tmp_path / "my_mini")}))
    return run


# ---------------------------------------------------------------- 12, 17: what is read from the run's model.json


def test_inferred_data_goes_next_to_run_so_hydra_flags_may_follow(recorded_run):
    argv = [f"run={recorded_run}", "--cfg", "job", "--resolve"]
    inferred = cli._infer_from_run(argv)
    assert inferred[:3] == [f"run={recorded_run}", "data=mini", f"data.source={recorded_run.parent.parent / 'my_mini'}"]
    assert inferred[3:] == ["--cfg", "job", "--resolve"]
    assert cli._source_note == [f"recorded in {recorded_run / 'model.json'}"]


@pytest.mark.parametrize("given", ["paths.mini_dir=/elsewhere", "data.source=/elsewhere", "paths.data_dir=/x"])
def test_a_source_the_user_gives_beats_the_recorded_one(recorded_run, given):
    inferred = cli._infer_from_run([f"run={recorded_run}", given])
    assert inferred == [f"run={recorded_run}", "data=mini", given]
    assert cli._source_note[0].startswith(f"given by {given.split('=')[0]} (the run was trained on ")


@pytest.mark.parametrize("given", ["paths.mini_dir=/elsewhere", "paths.data_dir=/x", "paths.root_dir=/y",
                                   "$RGB_ROOT"])
def test_a_path_of_the_mini_data_keeps_the_recorded_source_of_a_card_dataset(tmp_path, monkeypatch, given):
    """Issue 33: `paths.mini_dir=` (or another path the mini data follows) given for a run trained on a card
    dataset dropped the run's recorded source: flowers-102 was read from the hub id instead of the snapshot."""
    run = tmp_path / "flowers"
    run.mkdir()
    (run / "model.json").write_text(json.dumps({"dataset": "flowers-102", "data_source": "/snapshots/rgb"}))
    monkeypatch.delenv("RGB_BENCHMARK", raising=False)
    monkeypatch.delenv("RGB_ROOT", raising=False)
    if given.startswith("$"):
        monkeypatch.setenv(given[1:], str(tmp_path))
    argv = [f"run={run}"] + ([] if given.startswith("$") else [given])
    assert cli._infer_from_run(argv) == [f"run={run}", "data=flowers102", "data.source=/snapshots/rgb", *argv[1:]]
    assert cli._source_note == [f"recorded in {run / 'model.json'}"]


def test_rgb_benchmark_keeps_the_recorded_source_of_a_mini_run_and_moves_a_card_one(recorded_run, tmp_path,
                                                                                   monkeypatch):
    """$RGB_BENCHMARK chooses the card datasets' source only: a mini run keeps its recorded one."""
    monkeypatch.setenv("RGB_BENCHMARK", "/hub/mirror")
    assert cli._infer_from_run([f"run={recorded_run}"])[2] == f"data.source={tmp_path / 'my_mini'}"
    run = tmp_path / "flowers"
    run.mkdir()
    (run / "model.json").write_text(json.dumps({"dataset": "flowers-102", "data_source": "/snapshots/rgb"}))
    assert cli._infer_from_run([f"run={run}"]) == [f"run={run}", "data=flowers102"]
    assert cli._source_note[0].startswith("given by $RGB_BENCHMARK (the run was trained on /snapshots/rgb)")


def test_the_recorded_source_is_not_used_for_another_data_config(recorded_run):
    assert cli._infer_from_run([f"run={recorded_run}", "data=flowers102"]) == [f"run={recorded_run}", "data=flowers102"]


def test_a_recorded_source_with_spaces_is_quoted_for_hydra(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "model.json").write_text(json.dumps({"dataset": "digits", "data_source": "/my data/it's"}))
    assert cli._infer_from_run([f"run={run}"])[2] == "data.source='/my data/it\\'s'"


@pytest.mark.slow
def test_attack_cfg_job_resolve_shows_the_recorded_source(recorded_run):
    """`attack.py run=X --cfg job --resolve` failed with "unrecognized arguments: data=mini"."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RGB_THREADS": "1"}
    shown = subprocess.run([sys.executable, str(REPO / "attack.py"), f"run={recorded_run}", "--cfg", "job",
                            "--resolve"], capture_output=True, text=True, env=env, timeout=600)
    assert shown.returncode == 0, shown.stderr[-1500:]
    assert f"source: {recorded_run.parent.parent / 'my_mini'}" in shown.stdout and "dataset: digits" in shown.stdout


# ---------------------------------------------------------------- 14: the program as invoked


def test_errors_name_the_program_as_it_was_invoked(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/rgb-attack"])
    with pytest.raises(SystemExit) as err:
        cli.attack_main()
    assert str(err.value).startswith("rgb-attack: error: no model given")
    monkeypatch.setattr(sys, "argv", [str(REPO / "evaluate.py")])
    with pytest.raises(SystemExit) as err:
        cli.evaluate_main()
    assert str(err.value).startswith("evaluate.py: error: nothing to evaluate")


# ---------------------------------------------------------------- 22: run names that would leave the tree


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", "", "x" * 300])
def test_run_names_that_are_not_one_directory_are_refused(name):
    with raises_one_line(ConfigValueError) as err:
        path_name(name)
    assert "choose another run_name" in str(err.value)


@pytest.mark.parametrize("overrides, expected", [
    (["model.name=hf-hub:timm/vit_tiny"], "hf-hub_timm--vit_tiny-ce-full_finetune-e"),
    (["model=openclip_mini", "strategy=zeroshot", "model.name=hf-hub:org/clip"], "hf-hub_org--clip-zeroshot-cpe-s0"),
    (["model=api_chat", "model.base_url=http://127.0.0.1:1/v1", "model.api_model=Qwen/Qwen2-VL"],
     "api-Qwen--Qwen2-VL"),
])
def test_default_run_names_of_hub_and_api_models_are_one_directory(overrides, expected, tmp_path, compose):
    """Hub names (`hf-hub:ORG/NAME`) and served model names (`ORG/NAME`) hold '/': the default run name spells
    them as one directory name instead of being refused (or nesting folders)."""
    cfg = compose("train", *overrides, f"paths.output_dir={tmp_path}")
    assert str(cfg.run_name).startswith(expected) and path_name(cfg.run_name) == cfg.run_name


@pytest.mark.parametrize("config, argv", [
    ("train", ["run_name=../../escape"]),
    ("train", ["run_name=" + "x" * 300]),
    ("attack", ["run=RUN", "run_name=../escape"]),
    ("evaluate", ["run=RUN", "run_name=a/b"]),
])
def test_entry_points_refuse_unsafe_run_names_before_hydra_creates_a_dir(config, argv, recorded_run, tmp_path):
    argv = [a.replace("RUN", str(recorded_run)) for a in argv] + [f"paths.output_dir={tmp_path / 'out'}"]
    problem = cli._compose_error(config, argv)
    assert problem is not None and "cannot name a directory" in problem and "\n" not in problem
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "escape").exists()


def test_benchmark_refuses_a_name_that_leaves_the_output_dir(tmp_path):
    import rgb

    with pytest.raises(ConfigValueError, match="cannot name a directory"):
        rgb.benchmark(torch.nn.Linear(2, 2), name="../../outside", output_dir=tmp_path / "out")
    assert not any(tmp_path.rglob("*.safetensors"))


# ---------------------------------------------------------------- 22: numbers that are not numbers, or out of range


@pytest.mark.parametrize("config, override, message", [
    ("attack", "seed=abc", "seed must be an integer, got 'abc'"),
    ("attack", "batch_size=0", "batch_size must be auto or an integer >= 1, got 0"),
    ("attack", "batch_size=most", "batch_size must be auto or an integer >= 1, got 'most'"),
    ("attack", "shard.index=-1", "shard.index must be null or an integer >= 0"),
    ("attack", "shard.count=two", "shard.count must be null or an integer >= 1"),
    ("attack", "tail_rows=-5", "tail_rows must be an integer >= 0"),
    ("attack", "fab_steps=0", "fab_steps must be null or an integer >= 1"),
    ("attack", "max_images=0", "max_images must be null or an integer >= 1"),
    ("attack", "capture=script", "capture must be one of"),
    ("attack", "data.budgets.linf=abc", "data.budgets.linf must be a finite number > 0, got 'abc'"),
    ("attack", "data.budgets.l2=-1", "data.budgets.l2 must be a finite number > 0"),
    ("evaluate", "max_images=abc", "max_images must be null or an integer >= 1, got 'abc'"),
    ("evaluate", "worst_k=[0]", "worst_k must be a non-empty list of class counts"),
    ("evaluate", "worst_k=[150%]", "worst_k must be"),
    ("evaluate", "batch_size=-2", "batch_size must be an integer >= 1"),
    ("evaluate", "text_robustness_options.p=1.5", "text_robustness_options.p must be a number in (0, 1)"),
    ("train", "data.eval_batch_size=x", "data.eval_batch_size must be an integer >= 1"),
])
def test_bad_numbers_are_one_line_naming_the_key(config, override, message, recorded_run, tmp_path):
    argv = ([] if config == "train" else [f"run={recorded_run}"]) + [override, f"paths.output_dir={tmp_path}"]
    problem = cli._compose_error(config, argv)
    assert problem is not None and message in problem and "\n" not in problem


def test_good_values_pass_the_checks(recorded_run, tmp_path):
    for config, argv in (("attack", ["shard.index=1", "shard.count=2", "data.budgets.linf=0.03"]),
                         ("evaluate", ["worst_k=[1,'10%',0.2]", "max_images=5", "allow_partial=true"])):
        assert cli._compose_error(config, [f"run={recorded_run}", f"paths.output_dir={tmp_path}", *argv]) is None


# ---------------------------------------------------------------- 22: output places that cannot be written


def test_an_output_dir_under_a_file_is_one_line(recorded_run, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    problem = cli._compose_error("attack", [f"run={recorded_run}", f"paths.output_dir={blocker / 'out'}"])
    assert problem.startswith(f"cannot create {blocker}/out/attack/digits/tiny/logs/")
    assert problem.endswith(f": {blocker} is a file, not a directory")


def unprivileged(function, *args):
    """`function(*args)` as a user without privileges: root (CI runs as root) writes into read-only directories,
    so there it runs in a fork that became `nobody` (its result comes back pickled)."""
    if os.geteuid() != 0:
        return function(*args)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, answer, leave without running the parent's cleanup
        os.close(read_end)
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_end, pickle.dumps(function(*args)))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def test_an_unwritable_output_dir_is_one_line():
    with tempfile.TemporaryDirectory() as top:  # not under pytest's tmp dirs, which only their owner may enter
        os.chmod(top, 0o755)
        locked = Path(top) / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        try:
            problem = unprivileged(cli.unwritable, locked / "out" / "x")
        finally:
            locked.chmod(0o700)
    assert "is not writable (read-only or no permission)" in problem


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "read-only filesystem"),
                                         (errno.EACCES, "no permission"), (errno.ENAMETOOLONG, "shorter run_name")])
def test_os_errors_of_the_users_machine_are_one_line(code, words):
    line = cli.os_error_line(OSError(code, os.strerror(code), "/out/eval/x/scores.json"))
    assert line.startswith(f"{os.strerror(code)}: /out/eval/x/scores.json (") and words in line
    assert cli.os_error_line(OSError(errno.EBADF, "Bad file descriptor")) is None  # a bug stays a traceback


# ---------------------------------------------------------------- the one error contract: rgb.core.errors.UserError

# The classes the commands once named in a table of strings (module, class): each is now a UserError.
FORMER_USER_ERRORS = [
    ("rgb.core.machine", "DeviceError"), ("rgb.data.benchmark", "BenchmarkError"),
    ("rgb.runs.store", "AttackRunError"), ("rgb.attacks.common", "AttackError"),
    ("rgb.models.factory", "WeightsMismatchError"), ("rgb.models.factory", "ModelLoadError"),
    ("rgb.core.files", "CorruptFileError"), ("rgb.core.templates", "PromptError"),
    ("rgb.zeroshot.ensembles", "EnsembleError"), ("rgb.brittleness.perturb", "PerturbationError"),
    ("rgb.training.config", "TrainingError"), ("rgb.evaluation.model_eval", "EvaluationError"),
    ("rgb.evaluation.leaderboard", "LeaderboardError"), ("rgb.core.jsonrecord", "RecordError"),
    ("rgb.core.values", "ConfigValueError"), ("rgb.models.io", "ExportFileError"),
    ("rgb.endpoints.client", "EndpointError"), ("rgb.endpoints.cache", "CacheError"), ("rgb.serve", "ServeError"),
]


def _error_classes_of_rgb() -> list[tuple[str, str]]:
    """(module, class) of every class named `...Error` defined in rgb/."""
    import ast

    found = []
    for path in sorted((REPO / "rgb").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        found += [(module, node.name) for node in tree.body
                  if isinstance(node, ast.ClassDef) and node.name.endswith("Error")]
    return found


def test_every_error_class_of_rgb_is_a_user_error():
    """The commands catch UserError: an error class a user can cause that does not derive from it would be a
    traceback (every error class rgb defines is one a user can cause)."""
    import importlib

    from rgb.core.errors import UserError

    classes = _error_classes_of_rgb()
    assert {name for _, name in FORMER_USER_ERRORS} <= {name for _, name in classes}
    assert [f"{m}.{name}" for m, name in FORMER_USER_ERRORS + classes
            if not issubclass(getattr(importlib.import_module(m), name), UserError)] == []


def test_a_user_error_inside_hydras_instantiation_error_is_the_line_shown():
    """Hydra wraps what a model or data class raises on its arguments (`model.weights=... model.pretrained=false`
    was a 7-line report): the UserError inside is found."""
    from hydra.errors import InstantiationException

    from rgb.models import create_model
    from rgb.models.factory import ModelLoadError

    with pytest.raises(ModelLoadError) as refused:
        create_model("test_resnet", 10, pretrained=False, weights="w.pt")
    try:
        raise InstantiationException("Error in call to target 'create_model'") from refused.value
    except InstantiationException as wrapped:
        assert cli._user_error_in(wrapped) is refused.value
        assert cli._error_line(wrapped) == "weights='w.pt' given with pretrained=False; set pretrained=True to load them"
    assert cli._user_error_in(RuntimeError("a bug")) is None


def test_a_user_error_is_one_line_and_the_cli_prints_it_as_is():
    from rgb.core.errors import UserError

    err = UserError("a refused\n  value:\tsay what to do ")
    assert str(err) == "a refused value: say what to do"
    assert cli._error_line(err) == str(err) and cli._error_line(RuntimeError("a bug")) is None
    assert isinstance(ConfigValueError("x"), ValueError)  # the built-in bases stay for the code that catches them


def test_raises_one_line_refuses_a_message_on_several_lines():
    from rgb.core.errors import UserError

    with pytest.raises(AssertionError, match="not one line"):
        with raises_one_line(ValueError, match="a"):
            raise ValueError("a\nb")
    with raises_one_line(UserError, match="^a b$") as caught:
        raise UserError("a\nb")
    assert isinstance(caught.value, UserError)


# ---------------------------------------------------------------- 22: evaluate replaces its outputs whole


def test_a_failed_write_leaves_the_previous_outputs_as_they_were(tmp_path):
    out = tmp_path / "eval" / "run"
    out.mkdir(parents=True)
    (out / "scores.json").write_text("old scores")
    (out / "plot.png").write_text("old plot")
    with pytest.raises(OSError, match="No space"):
        with replaced_whole(out) as staging:
            (staging / "scores.json").write_text("new scores")
            raise OSError(errno.ENOSPC, "No space left on device", str(staging / "plot.png"))
    assert (out / "scores.json").read_text() == "old scores" and (out / "plot.png").read_text() == "old plot"
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]  # no staging copy left behind
    with replaced_whole(out) as staging:
        (staging / "scores.json").write_text("new scores")
    assert (out / "scores.json").read_text() == "new scores" and (out / "plot.png").read_text() == "old plot"
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]


def test_a_full_disk_while_copying_the_previous_outputs_is_the_commands_one_line(monkeypatch, tmp_path):
    """Evaluating again copies the previous outputs into a staging copy first; a full disk there was a shutil.Error
    (a list of strings without errno) and a 26-line traceback. Now: the disk-full line, nothing half-written."""
    out = tmp_path / "eval" / "run"
    (out / "plots").mkdir(parents=True)
    (out / "scores.json").write_text("old scores")
    (out / "plots" / "settings.png").write_text("old plot")

    def full(src, dst, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(shutil, "copyfile", full)
    with pytest.raises(OSError) as caught:
        with replaced_whole(out):
            pytest.fail("the block ran without the staging copy")
    line = cli._error_line(caught.value)
    assert line is not None and "\n" not in line and "the disk is full" in line and "settings.png" in line
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]  # no staging copy left behind
    assert (out / "scores.json").read_text() == "old scores" and (out / "plots" / "settings.png").is_file()


def test_evaluate_writes_into_a_staging_copy_then_replaces(monkeypatch, tmp_path):
    import rgb.evaluation.run as run_module
    from rgb.evaluation.request import EvalRequest, RunOutputs

    seen = []

    def evaluate_model(model, meta, weights, datamodule, request, train):
        seen.append(request.model.output_dir)
        (request.model.output_dir / "scores.json").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "eval"
    out.mkdir()
    (out / "scores.json").write_text("complete")
    run = tmp_path / "model"
    export_model(create_model("test_resnet", 10, pretrained=False), run, {"dataset": "digits", "num_classes": 10})
    monkeypatch.setattr(run_module, "evaluate_model", evaluate_model)
    request = EvalRequest(
        model=RunOutputs(run, "model", out), attack_dir=tmp_path / "attack", data=lambda: None,
        protocol="white_box", transfer=False, severity_sweep=False, allow_partial=False, max_images=None,
        worst_k=(1,), device="cpu", batch_size=8, api_cache_dir=tmp_path / "cache",
        dry_run=False, wandb_project=None)
    with pytest.raises(OSError):
        run_module.evaluate(request)
    assert seen and seen[0] != out and (out / "scores.json").read_text() == "complete"


# ---------------------------------------------------------------- 22: damaged exports are named


@pytest.mark.parametrize("damaged", ["model.json", "model.safetensors"])
def test_a_truncated_export_is_named_in_one_line(tmp_path, damaged):
    export_model(create_model("test_resnet", 10, pretrained=False), tmp_path, {"dataset": "digits"})
    path = tmp_path / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with raises_one_line(ExportFileError) as err:
        load_with_meta(tmp_path)
    assert str(path) in str(err.value) and "export the model again" in str(err.value)


def test_an_empty_descriptions_list_is_one_line(tmp_path):
    from rgb.zeroshot.prompts import PromptError, load_descriptions

    path = tmp_path / "descriptions.json"
    path.write_text(json.dumps({"cat": []}))
    with pytest.raises(PromptError, match="'cat' must map to a non-empty list of non-empty strings"):
        load_descriptions(path, ["cat", "dog"])


@pytest.mark.parametrize("env, expected", [({}, "3000"), ({"GOMP_SPINCOUNT": "77"}, "77"),
                                           ({"OMP_WAIT_POLICY": "PASSIVE"}, None)])
@pytest.mark.slow
def test_entry_points_shorten_openmp_spinning_before_torch_loads(env, expected):
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: the entry points set it first (a user's own
    setting, or OMP_WAIT_POLICY, wins)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = "import sys, os, rgb.commands.main; print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))"
    shown = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                           check=True).stdout.split()
    assert shown == ["False", str(expected)]


_FAULTS = """
import resource, sys, torch
from rgb.core.machine import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                          torch.nn.Linear(16 * 32 * 32, 10)).requires_grad_(False)
x = torch.rand(64, 3, 32, 32, requires_grad=True)
def step():
    torch.autograd.grad(net(x)[:, 0].sum(), x)
for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.slow
def test_kept_memory_serves_the_next_step_without_page_faults():
    """An attack's step, a small CNN's forward and backward to the input: under glibc's defaults each step's
    4 MiB activations come from memory handed back to the kernel (1,800-3,300 page faults a step seen here);
    with keep_freed_memory the freed blocks serve the next step (0-150)."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    faults = {}
    for mode in ("default", "keep"):
        shown = subprocess.run([sys.executable, "-c", _FAULTS, mode], env=clean, capture_output=True, text=True,
                               check=True).stdout.split()
        faults[mode] = (shown[0], int(shown[1]))
    if faults["default"][1] < 1000:
        pytest.skip(f"this C library's defaults keep the memory already ({faults['default'][1]} faults a step)")
    assert faults["keep"][0] == "True"
    assert faults["keep"][1] < 500


def test_a_users_own_malloc_settings_win(monkeypatch):
    from rgb.core.machine import keep_freed_memory

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert keep_freed_memory() is False


# ---------------------------------------------------------------- errors in a second (issue 53 item 5)


@pytest.mark.slow  # a fresh interpreter per case (pytest's has torch loaded)
@pytest.mark.parametrize("argv", [
    ["train.py", "trainer.max_epochz=3"],  # an unknown key
    ["attack.py", "run=outputs/train/digits/no-such-run", "max_imagez=3"],
    ["evaluate.py", "run=outputs/train/digits/no-such-run", "max_imagez=3"],
    ["attack.py", "norms=[linf]"],  # no run given
])
def test_config_mistakes_are_said_before_torch_is_imported(argv, tmp_path):
    """benchmarks/startup_time.py --errors times these; here: nothing of torch is loaded before the one line."""
    script = ("import sys\nfrom rgb.commands import main\n"
              f"sys.argv = {argv!r}\n"
              "try:\n    getattr(main, sys.argv[0].removesuffix('.py') + '_main')()\n"
              "except SystemExit as done:\n    print(done)\n"
              "print('torch loaded' if 'torch' in sys.modules else 'no torch')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300).stdout.splitlines()
    assert out[-2].startswith(f"{argv[0]}: error: ") and out[-1] == "no torch", out


# A bad value per command (and the line's start): the schema's rules come from torch-free modules, so the one line
# is said before torch loads (benchmarks/startup_time.py --errors times these).
BAD_VALUES = {
    "attack": (["norms=[L3]", "steps=-1"], "attack.py: error: invalid value: steps must be an integer >= 1, got -1; "
                                           "norms must be a non-empty list"),
    "serve": (["limits.max_queue=-1"], "serve.py: error: invalid value: limits.max_queue must be an integer >= 0, got -1"),
    "transfer": (["batch_size=-1"], "transfer.py: error: invalid value: batch_size must be auto or an integer >= 1, "
                                    "got -1"),
    "evaluate": (["max_images=-1"], "evaluate.py: error: invalid value: max_images must be null or an integer >= 1, "
                                    "got -1"),
    # train.py takes no run=: its bad values are of its own sections (robust validation's, the strategies')
    "train": (["callbacks=robust_val", "callbacks.robust_val.n_iter=0", "strategy.name=foo"],
              "train.py: error: invalid value: strategy.name must be one of full_finetune, linear_probe, zeroshot, api, "
              "got 'foo'; callbacks.robust_val.n_iter must be an integer >= 1, got 0"),
    # the prompts group's keys, each on its field's rule (the ensemble's name too, not a check after torch)
    "train_prompts": (["model=openclip_mini", "strategy=zeroshot", "prompts.ensemble=best", "prompts.mad_t=-2"],
                      "train.py: error: invalid value: prompts.ensemble must be one of single, mean, zpe, zpe_select, "
                      "cpe, got 'best'; prompts.mad_t must be a finite number >= 0, got -2"),
}


@pytest.mark.slow  # a fresh interpreter (pytest's has torch loaded)
def test_a_bad_value_is_said_in_one_line_before_torch_is_imported(tmp_path):
    """One interpreter runs each command's entry point on a bad value, for a run that exists (its model.json read
    by the config's resolvers): one line each, and torch never loaded."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.json").write_text(json.dumps({"family": "timm", "num_classes": 2, "class_names": ["a", "b"],
                                                "dataset": "digits", "run_name": "r", "image_size": 32}))
    (run / "model.safetensors").write_bytes(b"")
    cases = {case: [f"{command}.py", *([] if command == "train" else [f"run={run}"]), *given]
             for case, (given, _) in BAD_VALUES.items() for command in [case.split("_")[0]]}
    script = ("import json, sys\nfrom rgb.commands import main\nlines = {}\n"
              f"for command, argv in {cases!r}.items():\n"
              "    sys.argv = argv\n"
              "    try:\n        getattr(main, argv[0].removesuffix('.py') + '_main')()\n"
              "    except SystemExit as done:\n        lines[command] = str(done)\n"
              "    lines[command + ' torch'] = 'torch' in sys.modules\n"
              "print(json.dumps(lines))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    lines = json.loads(done.stdout.splitlines()[-1])
    for command, (_, line) in BAD_VALUES.items():
        assert lines[command].startswith(line) and "\n" not in lines[command], lines
        assert lines[f"{command} torch"] is False, command


def test_an_import_error_behind_a_config_value_is_an_import_error(monkeypatch):
    """A resolver whose module does not import (a broken install) was reported as a config error on
    hydra.run.dir; it is the ImportError itself."""
    monkeypatch.setitem(sys.modules, "rgb.runs.store", None)  # `import rgb.runs.store` raises ImportError
    with pytest.raises(ImportError, match="rgb.runs.store"):
        cli._compose_error("train", ["run_name=x"])


def test_each_lightning_line_is_printed_once(monkeypatch):
    """The `lightning` package's own console handler printed each of its lines ("INFO: ...") beside Hydra's root
    handler ("[...][lightning.pytorch.utilities.rank_zero][INFO] - ..."): after the command's set-up, only the root
    logger's handlers see them."""
    import logging

    import lightning  # noqa: F401  (its console handler comes with the import)

    loggers = [logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "lightning.fabric")]
    for logger in loggers:  # restored after the test
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
    logging.getLogger("lightning").addHandler(logging.StreamHandler())  # as `import lightning` does
    seen = []

    class Counting(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    root = logging.getLogger()
    counting = Counting()
    root.addHandler(counting)
    try:
        cli.lightning_through_root()
        logging.getLogger("lightning.pytorch.utilities.rank_zero").warning("`Trainer.fit` stopped")
    finally:
        root.removeHandler(counting)
    assert seen == ["`Trainer.fit` stopped"]
    assert [h for logger in loggers for h in logger.handlers] == []  # no second console voice
