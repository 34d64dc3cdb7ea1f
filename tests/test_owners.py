"""One owner per concept, read from the source: where a second spelling of a name, a format or a primitive could
creep back in unnoticed, a check here finds it (an AST walk over rgb/; for a default that conf/ shows too, a read
of the YAML against the code's), and a check of the check shows it would.
"""

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest
import yaml

from rgb.core.threat import Norm
from helpers import REPO

RGB = REPO / "rgb"
CONF = REPO / "conf"
# A whole file from one call: the writes a JSON record must not be hand-made with.
FILE_WRITES = {"write_text", "write_bytes", "atomic_write_bytes"}
# Functions that own one per-norm rule (the budget's float tolerance; the norm's value is rgb.core.threat.lp_norm's,
# outside rgb/attacks): a branch on the norm there is that rule's table.
NORM_OWNERS = {"rgb/attacks/autoattack.py::within_budget"}


def rgb_tree(tmp_path: Path, module: str, source: str) -> Path:
    """A one-module rgb/ tree under tmp_path (module `module`, holding `source`): what a check is shown on."""
    path = tmp_path / "rgb" / module
    path.parent.mkdir(parents=True)
    path.write_text(source)
    return tmp_path / "rgb"


def _modules(root: Path = RGB):
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root.parent).as_posix(), ast.parse(path.read_text(), filename=str(path))


def white_box_setting_spellings(root: Path = RGB) -> list[str]:
    """'file:line' of every white-box setting name written outside rgb.evaluation.records (its owner): a string
    starting "autoattack_" (RobustBench's `autoattack_acc` key is a format's, not a setting), or a literal tuple or
    list holding both "test" and "common"."""
    found = []
    for name, tree in _modules(root):
        if name == "rgb/evaluation/records.py":
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("autoattack_")
                    and node.value != "autoattack_acc"):
                found.append(f"{name}:{node.lineno}")
            elif isinstance(node, (ast.Tuple, ast.List)) and {"test", "common"} <= {
                    e.value for e in node.elts if isinstance(e, ast.Constant)}:
                found.append(f"{name}:{node.lineno}")
    return found




def file_moves(root: Path = RGB) -> list[str]:
    """'file:line' of every os.replace / os.rename / shutil.move outside rgb.core.files, the one owner of putting
    a file or a folder in place whole (atomic_output, atomic_write_json, replaced_whole)."""
    moves = {("os", "replace"), ("os", "rename"), ("shutil", "move")}
    return [f"{name}:{node.lineno}" for name, tree in _modules(root) if name != "rgb/core/files.py"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in moves]




def hand_written_json_files(root: Path = RGB) -> list[str]:
    """'file:line' of every JSON file written by hand outside rgb.core.files (its `atomic_write_json` is the one
    way: indented, newline-terminated, whole): json.dump to a handle, or json.dumps handed to a whole-file write.
    Appending one line to a JSONL log (`handle.write`) is another format and passes."""
    found = []
    for name, tree in _modules(root):
        if name == "rgb/core/files.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = ast.unparse(node.func)
            if called == "json.dump" or called.split(".")[-1] in FILE_WRITES and any(
                    isinstance(n, ast.Call) and ast.unparse(n.func) == "json.dumps"
                    for arg in node.args for n in ast.walk(arg)):
                found.append(f"{name}:{node.lineno}")
    return found




def _outside(owner: str, seen, root: Path) -> list[str]:
    """'file:line' of every node `seen` accepts outside `owner` ("rgb/file.py:function"), the one place for it."""
    owner_file, owner_function = owner.split(":")
    found = []
    for name, tree in _modules(root):
        helper = next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                       and name == owner_file and node.name == owner_function), None)
        inside = {id(n) for n in ast.walk(helper)} if helper else set()
        found += [f"{name}:{line}" for line in sorted(node.lineno for node in ast.walk(tree)
                                                       if seen(node) and id(node) not in inside)]
    return found


def wandb_opens(root: Path = RGB) -> list[str]:
    """'file:line' of every `wandb.init(` outside rgb.runs.wandb_report.wandb_run, the one helper that opens a
    W&B run with the project's settings (directory, stable id, resume)."""
    return _outside("rgb/runs/wandb_report.py:wandb_run",
                    lambda node: isinstance(node, ast.Call) and ast.unparse(node.func) == "wandb.init", root)


# rgb-serve's key is the one the server requires of its callers (unset: refused), not one rgb sends an endpoint.
SERVER_KEY = "rgb/commands/serve.py"


def _reads_api_key(node: ast.AST) -> bool:
    """An environment read (os.environ.get / [...], os.getenv) of the variable an `api_key_env` names."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) in {"os.environ.get", "os.getenv", "environ.get"}:
        read = node.args[:1]
    elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in {"os.environ", "environ"}:
        read = [node.slice]
    else:
        return False
    return any("api_key_env" in ast.unparse(arg) for arg in read)


def endpoint_key_reads(root: Path = RGB) -> list[str]:
    """'file:line' of an endpoint's API key read from the environment outside rgb.endpoints.client.Endpoint.api_key,
    its one owner (None when unset or empty, read at each use)."""
    return [found for found in _outside("rgb/endpoints/client.py:api_key", _reads_api_key, root)
            if not found.startswith(f"{SERVER_KEY}:")]


def openai_clients(root: Path = RGB) -> list[str]:
    """'file:line' of every `openai` SDK client built (`OpenAI(`, `openai.AsyncOpenAI(`, ...) outside
    rgb.endpoints.client.Endpoint.sdk, the one builder: the endpoint's address (the declared query and headers, the
    secret ones from the environment), its timeout."""
    return _outside("rgb/endpoints/client.py:sdk", lambda node: isinstance(node, ast.Call)
                    and ast.unparse(node.func).split(".")[-1].endswith("OpenAI"), root)




def folder_names_spelled_again(root: Path = RGB) -> list[str]:
    """'file:line' of an output folder name written outside its owner: the run-directory layout's side folders
    (rgb.runs.store), model_info (rgb.evaluation.exports), site (rgb.evaluation.site), as a path part (`x / "name"`)
    or a module constant. (The same word as a config flag or a JSON key is another name and passes.)"""
    from rgb.evaluation.exports import MODEL_INFO_DIR
    from rgb.evaluation.site import SITE_DIR
    from rgb.runs.store import ADVERSARIAL_DIR, PARTIAL_DIR, SWEEPS_DIR, TEXT_ROBUSTNESS_DIR, ZEROSHOT_REPORT_DIR

    owners = {ZEROSHOT_REPORT_DIR: "rgb/runs/store.py", TEXT_ROBUSTNESS_DIR: "rgb/runs/store.py",
              PARTIAL_DIR: "rgb/runs/store.py", SWEEPS_DIR: "rgb/runs/store.py", ADVERSARIAL_DIR: "rgb/runs/store.py",
              MODEL_INFO_DIR: "rgb/evaluation/exports.py", SITE_DIR: "rgb/evaluation/site.py"}
    found = []
    for name, tree in _modules(root):
        spelled = []
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                spelled += [node.left, node.right]
            elif isinstance(node, ast.Assign) and node in tree.body:
                spelled.append(node.value)
        found += [f"{name}:{node.lineno}" for node in spelled if isinstance(node, ast.Constant)
                  and owners.get(node.value, name) != name]
    return found


def board_file_names_spelled_again(root: Path = RGB) -> list[str]:
    """'file:line' of a leaderboard output file name (rgb.evaluation.leaderboard.LEADERBOARD_FILES: leaderboard.md,
    .csv, .json, .png, seeds.md, .json) written as a whole string outside its owner, rgb.evaluation.leaderboard.
    (A docstring naming one among other words is prose, and passes.)"""
    from rgb.evaluation.leaderboard import LEADERBOARD_FILES

    return [f"{name}:{node.lineno}" for name, tree in _modules(root) if name != "rgb/evaluation/leaderboard.py"
            for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in LEADERBOARD_FILES]


def file_names_from_run_names(root: Path = RGB) -> list[str]:
    """'file:line' of a path part (`x / ...`) spelled from a model's run name other than through
    rgb.core.files.distinct_name (a file of its own per name) or rgb.core.values.path_name (a run's own directory,
    one path component): `x 1`, `x+1` and `x_1` once shared model_info/<dataset>/<norm>/x_1.json."""

    def names_a_run(node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("distinct_name", "path_name"):
            return False
        if (isinstance(node, ast.Attribute) and node.attr == "run_name") or (
                isinstance(node, ast.Name) and node.id == "run_name") or (
                isinstance(node, ast.Subscript) and ast.unparse(node.slice) in ("'run_name'", "'name'")):
            return True
        return any(names_a_run(child) for child in ast.iter_child_nodes(node))

    found = []
    for name, tree in _modules(root):
        found += [f"{name}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.BinOp)
                  and isinstance(node.op, ast.Div) and names_a_run(node.right)]
    return sorted(found)


def norm_branches(root: Path = RGB) -> list[str]:
    """'file:line' of every comparison with a norm's name ("Linf", "l2", Norm.L1, ...) in rgb/attacks outside the
    per-norm owners: what a norm means to an attack is a per-norm class or table looked up once (apgd's `_BALLS`,
    square's `_SQUARE_NORMS`, fab's `_PROJECTIONS`), not a branch in its loop."""
    names = {norm.value.lower() for norm in Norm}
    found = []
    for name, tree in _modules(root):
        if not name.startswith("rgb/attacks/"):
            continue
        owned = {id(n) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and f"{name}::{node.name}" in NORM_OWNERS for n in ast.walk(node)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare) or id(node) in owned:
                continue
            operands = [node.left, *node.comparators]
            operands += [e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts]
            if any(isinstance(o, ast.Constant) and isinstance(o.value, str) and o.value.lower() in names
                   or isinstance(o, ast.Attribute) and ast.unparse(o) in {f"Norm.{n.name}" for n in Norm}
                   for o in operands):
                found.append(f"{name}:{node.lineno}")
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def owned_names_spelled_again(root: Path = RGB) -> list[str]:
    """'file:line' of a name with one owner written as a literal outside it: a run directory's or an export's record
    file (run.json, model.json, summary.json, scores.json, ...), open_clip's checkpoint files, the validation
    metrics training logs and its monitors read, the card's control split, the card's protocol names (white_box,
    black_box: records' keys, boards, `protocol=`). Flagged: a string that is the name, or a
    path or glob ending in it ("*/summary.json"); prose that mentions the file passes."""
    from rgb.core.rundir import MANIFEST as RUN_MANIFEST
    from rgb.data.catalog import BLACK_BOX, CONTROL_SPLIT, WHITE_BOX
    from rgb.data.layout import README
    from rgb.evaluation.exports import MANIFEST as EXPORTS_MANIFEST
    from rgb.evaluation.records import PARTIAL_SCORES_FILE, SCORES_FILE
    from rgb.core.exportfiles import META_FILE, WEIGHTS_FILE
    from rgb.models.openclip import CHECKPOINT_FILE, CONFIG_FILE
    from rgb.runs.store import BATCH_SIZE_FILE, COST_ESTIMATE_FILE, POOLED_PLAN, RESULTS_FILE, SUMMARY_FILE
    from rgb.training.module import VAL_ACC, VAL_LOSS

    owners = {RUN_MANIFEST: "rgb/core/rundir.py", **dict.fromkeys((META_FILE, WEIGHTS_FILE), "rgb/core/exportfiles.py"),
              **dict.fromkeys((RESULTS_FILE, SUMMARY_FILE, BATCH_SIZE_FILE, COST_ESTIMATE_FILE, POOLED_PLAN),
                              "rgb/runs/store.py"),
              SCORES_FILE: "rgb/evaluation/records.py", PARTIAL_SCORES_FILE: "rgb/evaluation/records.py",
              EXPORTS_MANIFEST: "rgb/evaluation/exports.py", CONFIG_FILE: "rgb/models/openclip.py",
              CHECKPOINT_FILE: "rgb/models/openclip.py", VAL_ACC: "rgb/training/module.py",
              VAL_LOSS: "rgb/training/module.py", CONTROL_SPLIT: "rgb/data/catalog.py", README: "rgb/data/layout.py",
              WHITE_BOX: "rgb/data/catalog.py", BLACK_BOX: "rgb/data/catalog.py"}
    # The same spelling naming another format's file: timm's hub repos hold a model.safetensors of their own.
    other_formats = {("rgb/models/factory.py", WEIGHTS_FILE)}
    found = []
    for name, tree in _modules(root):
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found += [f"{name}:{node.lineno}" for owned, owner in owners.items()
                          if owner != name and (name, owned) not in other_formats
                          and (node.value == owned or node.value.endswith("/" + owned))]
    return found


def _constant_value(node: ast.expr):
    """The value of a module constant worth one owner (a literal collection of two or more items, a string of four
    characters or more, a number of magnitude 100 or more), as a comparable key; None for anything else."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("frozenset", "set", "tuple") and len(node.args) == 1:
        node = node.args[0]
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, (tuple, list, set, frozenset, dict)) and len(value) >= 2:
        return repr(sorted(map(repr, value))) if isinstance(value, (set, frozenset)) else repr(value)
    if isinstance(value, str) and len(value) >= 4 or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 100):
        return repr(value)
    return None


def constants_copied(root: Path = RGB) -> list[str]:
    """'file:line' of every module constant whose value another module constant also holds (in any module): a
    copy of a table, a name or a limit instead of an import of its one owner (CARD_FIELDS was in the model card and
    in the site; OpenAI's Batch statuses in its client and in rgb-serve)."""
    sites: dict[str, list[str]] = {}
    for name, tree in _modules(root):
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None else None
            key = None if value is None else _constant_value(value)
            if key is not None:
                sites.setdefault(key, []).append(f"{name}:{node.lineno}")
    return sorted(site for places in sites.values() if len(places) > 1 for site in places)


# Each check, and a small rgb/ tree it must flag: (check, module, source, what it reports).
CHECKS = [
    (white_box_setting_spellings, "evaluation/board.py",
     'SETTINGS = ("test", "common", "l1")\nKEY = f"autoattack_{1}"\nACC = "autoattack_acc"\n',
     ["rgb/evaluation/board.py:1", "rgb/evaluation/board.py:2"]),
    (file_moves, "runs/writer.py",
     "import os, shutil\nos.replace('a.tmp', 'a')\nshutil.move('d.new', 'd')\n'x'.replace('a', 'b')\n",
     ["rgb/runs/writer.py:2", "rgb/runs/writer.py:3"]),
    (hand_written_json_files, "runs/writer.py",
     "import json\nPath('a').write_text(json.dumps({}) + '\\n')\njson.dump({}, handle)\n"
     "atomic_write_bytes(p, (json.dumps(r, indent=2) + '\\n').encode())\n"
     "handle.write(json.dumps(line) + '\\n')\n",
     [f"rgb/runs/writer.py:{n}" for n in (2, 3, 4)]),
    (wandb_opens, "runs/wandb_report.py",
     "import wandb\ndef wandb_run():\n    wandb.init()\ndef other():\n    wandb.init()\n",
     ["rgb/runs/wandb_report.py:5"]),
    (folder_names_spelled_again, "evaluation/report.py",
     'REPORT = "zeroshot_report"\nout = root / "text_robustness" / "site"\n'
     'def f(job_type="text_robustness"):\n    return {"partial": "model_info"}\n',
     [f"rgb/evaluation/report.py:{n}" for n in (1, 2, 2)]),
    (board_file_names_spelled_again, "evaluation/wandb_report.py",
     'FILES = ("leaderboard.md", "seeds.json")\ndef f(d):\n    "leaderboard.md and seeds.json"\n'
     '    return d / "leaderboard.png"\n',
     [f"rgb/evaluation/wandb_report.py:{n}" for n in (1, 1, 4)]),
    (endpoint_key_reads, "endpoints/client.py",
     "import os\nclass Endpoint:\n    def api_key(self):\n        return os.environ.get(self.s.api_key_env)\n"
     "key = os.environ.get(settings.api_key_env) or 'no-key'\nkey = os.environ[model.client_settings.api_key_env]\n"
     "home = os.environ.get('HOME')\n",
     ["rgb/endpoints/client.py:5", "rgb/endpoints/client.py:6"]),
    (openai_clients, "endpoints/client.py",
     "import openai\ndef sdk():\n    return openai.OpenAI()\ndef other():\n    return OpenAI(), openai.AsyncOpenAI()\n",
     ["rgb/endpoints/client.py:5", "rgb/endpoints/client.py:5"]),
    (file_names_from_run_names, "evaluation/leaderboard.py",
     'def f(out, record, info, run_name):\n    a = out / record.dataset / f"{record.model.run_name}.json"\n'
     '    b = out / f"{info[\'name\']}.json"\n    c = out / run_name\n'
     '    return out / f"{distinct_name(record.model.run_name)}.json", out / path_name(run_name)\n',
     [f"rgb/evaluation/leaderboard.py:{n}" for n in (2, 3, 4)]),
    (norm_branches, "attacks/pgd.py",
     'def step(norm):\n    if norm == "Linf":\n        return 1\n    return 2 if norm != Norm.L2 else {"L1": 3}["L1"]\n'
     'def ok(norm):\n    return norm in ("l2", "L1") or norm.p == 2\n',
     ["rgb/attacks/pgd.py:2", "rgb/attacks/pgd.py:4", "rgb/attacks/pgd.py:6"]),
    (owned_names_spelled_again, "evaluation/report.py",
     'SUMMARY = "summary.json"\nfiles = d.glob("*/summary.json")\nwhy = "no summary.json here"\n'
     'metric = {"val/acc": 1.0}\nconfig = d / "open_clip_config.json"\n'
     'def board(protocol="white_box"):\n    "the white_box board"\n    return {"black_box": 1}[protocol]\n',
     [f"rgb/evaluation/report.py:{n}" for n in (1, 2, 4, 5, 6, 8)]),
    (constants_copied, "serve/batch.py",
     'DONE = frozenset({"completed", "failed"})\nSTATES = {"failed", "completed"}\nLIMIT = 50_000\nMAX = 50000\n'
     'FLAGS = ("a", "b")\nSMALL = 10\nALSO_SMALL = 10\nNAME = "site"\nPAGE = "site"\nNOT_A_LITERAL = f(1)\n',
     [f"rgb/serve/batch.py:{n}" for n in (1, 2, 3, 4, 8, 9)]),
]


@pytest.mark.parametrize("check", [c[0] for c in CHECKS], ids=lambda c: c.__name__)
def test_each_concept_has_one_owner(check):
    assert check() == []


@pytest.mark.parametrize(("check", "module", "source", "expected"), CHECKS, ids=[c[0].__name__ for c in CHECKS])
def test_the_check_sees_a_second_owner(tmp_path, check, module, source, expected):
    assert check(rgb_tree(tmp_path, module, source)) == expected


# A default that a conf/ YAML and the code it feeds both spell (attack.py's options and rgb.benchmark's, the prompts
# group and PromptSettings, ...): the code's is the owner, the YAML shows it to the user and must say the same.
# (YAML file under conf/, its section ("" = the top level), the dataclass or callable whose defaults it mirrors.)
YAML_DEFAULTS = [
    ("attack.yaml", "", "rgb.attacks.options:AttackOptions"),
    ("transfer.yaml", "", "rgb.attacks.options:AttackOptions"),
    ("prompts/_pool.yaml", "", "rgb.zeroshot.settings:PromptSettings"),
    ("callbacks/robust_val.yaml", "robust_val", "rgb.training.robust_val:RobustValidation"),
    ("serve.yaml", "", "rgb.serve.request:ServeRequest"),
    ("serve.yaml", "limits", "rgb.serve.request:Limits"),
    ("serve.yaml", "faults", "rgb.serve.request:Faults"),
    ("model/api_chat.yaml", "", "rgb.endpoints.settings:EndpointSettings"),
    ("model/api_chat.yaml", "", "rgb.endpoints.settings:ClientSettings"),
]
# Keys whose YAML value is meant to differ from the code's default, each with why.
YAML_NOT_DEFAULTS = {
    ("prompts/_pool.yaml", "dataset_templates"): "CLIP's per-dataset prompts are the config's; PromptSettings() "
                                                 "starts with none",
    ("serve.yaml", "port"): "the command listens where clients are told to look (vLLM's 8000); a ServeRequest made "
                            "in code (tests, scripts) takes any free port (0) and reads it from base_url",
}


def _code_defaults(target: str) -> dict:
    """{parameter: default} of a dataclass's fields or a callable's keyword parameters (those that have one)."""
    module, name = target.split(":")
    code = getattr(importlib.import_module(module), name)
    if dataclasses.is_dataclass(code):
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(code)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    return {p.name: p.default for p in inspect.signature(code).parameters.values() if p.default is not p.empty}


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def yaml_defaults_that_differ(conf: Path = CONF, table=YAML_DEFAULTS) -> list[str]:
    """'file:key' of every YAML value that is not the default of the code it feeds. A null (the code's default, or
    none), an interpolation (`${...}`, another owner's value), a required `???` and a section (a mapping: its own
    row) are not compared."""
    found = []
    for file, section, target in table:
        values = yaml.safe_load((conf / file).read_text())
        values = values[section] if section else values
        defaults = _code_defaults(target)
        found += [f"{file}:{key}" for key, value in values.items() if key in defaults and value is not None
                  and not (isinstance(value, str) and ("${" in value or value == "???"))
                  and not isinstance(value, dict) and (file, key) not in YAML_NOT_DEFAULTS
                  and _plain(value) != _plain(defaults[key])]
    return found


def test_each_yaml_default_is_its_codes():
    assert yaml_defaults_that_differ() == []


def yaml_dir_names(conf: Path = CONF) -> list[str]:
    """'file:line' of a conf/ YAML value spelling a run-store folder as a path part (`${output_dir}/multirun`): the
    configs name them through the store's resolvers (`${rgb.multirun_dir:...}`, `${rgb.adversarial_dir:...}`,
    `${rgb.text_robustness_dir:...}`, ...). Comments may name them."""
    import re

    from rgb.runs.store import ADVERSARIAL_DIR, PARTIAL_DIR, SWEEPS_DIR, TEXT_ROBUSTNESS_DIR, ZEROSHOT_REPORT_DIR

    names = "|".join((SWEEPS_DIR, ADVERSARIAL_DIR, PARTIAL_DIR, TEXT_ROBUSTNESS_DIR, ZEROSHOT_REPORT_DIR))
    part = re.compile(rf"/({names})(/|$|\s)|(^|\s)({names})/")
    found = []
    for path in sorted(conf.rglob("*.yaml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            value = line.split(":", 1)[1].split(" #")[0] if ":" in line and not line.lstrip().startswith("#") else ""
            if part.search(value.strip()):
                found.append(f"{path.relative_to(conf).as_posix()}:{number}")
    return found


def test_the_configs_name_the_stores_folders_through_it():
    assert yaml_dir_names() == []


def test_the_yaml_dir_check_sees_a_folder_spelled(tmp_path):
    (tmp_path / "attack.yaml").write_text("# multirun/<label> holds the logs\nsweep_dir: ${output_dir}/multirun  # x\n"
                                          "export_dir: ${rgb.adversarial_dir:${output_dir}}\nname: adversarial\n"
                                          "hydra:\n  dir: ${paths.output_dir}/multirun/${x}\n"
                                          "pool_dir: ${leaderboard_dir}/text_robustness # the comparison\n")
    assert yaml_dir_names(tmp_path) == ["attack.yaml:2", "attack.yaml:6", "attack.yaml:7"]


def test_the_yaml_check_sees_a_drift(tmp_path):
    (tmp_path / "attack.yaml").write_text("steps: 50\nqueries: 5000\nseed: ${x}\nattacks: null\nnorms: [l1]\n")
    (tmp_path / "robust.yaml").write_text("robust_val:\n  norms: [linf]\n  attacks: [apgd-ce, apgd-t]\n")
    table = [("attack.yaml", "", "rgb.attacks.options:AttackOptions"),
             ("robust.yaml", "robust_val", "rgb.training.robust_val:RobustValidation")]
    assert yaml_defaults_that_differ(tmp_path, table) == ["attack.yaml:steps", "robust.yaml:attacks"]
