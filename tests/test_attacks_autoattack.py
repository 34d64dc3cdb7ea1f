"""The AutoAttack cascade (spec §1, §8 items 3, 4, 8-11) on tiny models."""

import warnings

import pytest
import torch
from torch import nn

import subprocess
import sys

from rgb.attacks import ATTACKS, VERSIONS, AttackError, AttackResult, is_standard
from rgb.attacks.autoattack import AutoAttack, check_threat_model, within_budget
from rgb.attacks.common import AttackInputError
from rgb.core.errors import UserError
from helpers import raises_one_line
from rgb.attacks.model_calls import attack_model
from rgb.attacks.options import AttackOptions
from rgb.attacks.registry import AttackEntry, Step
from rgb.models.toy import separable_data

MIXED_EPS = {"Linf": 0.07, "L2": 0.8, "L1": 6.0}
LARGE_EPS = {"Linf": 0.15, "L2": 2.0, "L1": 20.0}


@pytest.fixture(scope="module")
def batch():
    return separable_data(32, seed=1)


def check_result(model, x, y, result, norm, eps):
    assert result.x_adv.shape == x.shape and not torch.isnan(result.x_adv).any()
    assert result.x_adv.min() >= 0 and result.x_adv.max() <= 1
    assert within_budget(result.x_adv - x, norm, eps).all()
    assert torch.equal(result.x_adv[result.robust], x[result.robust])  # not fooled -> exactly the clean image
    with torch.no_grad():
        correct = model(result.x_adv).argmax(1) == y
    assert torch.equal(correct, result.robust)  # cascade rule: recomputed from x_adv in fp32
    assert result.robust_accuracy == pytest.approx(correct.float().mean().item())
    assert not (result.robust & ~result.clean_correct).any()
    accuracies = list(result.accuracy_after.values())
    assert list(result.accuracy_after) == ["clean", *result.attacks]
    assert accuracies == sorted(accuracies, reverse=True) and accuracies[-1] == result.robust_accuracy
    assert torch.equal(result.fooled_by == -1, result.robust)
    assert torch.equal(result.fooled_by == 0, ~result.clean_correct)


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_undefended_model_is_broken(trained_mlp, batch, norm):
    x, y = batch
    result = AutoAttack(trained_mlp, norm.upper(), LARGE_EPS[norm], seed=0).run(x, y, batch_size=32)
    check_result(trained_mlp, x, y, result, norm, LARGE_EPS[norm])
    assert result.accuracy_after["clean"] >= 0.95
    assert result.robust_accuracy <= 0.05
    assert result.attacks == ["apgd-ce", "apgd-t", "fab-t", "square"]


@pytest.mark.parametrize("norm", ["Linf", pytest.param("L2", marks=pytest.mark.slow),
                                  pytest.param("L1", marks=pytest.mark.slow)])
def test_partly_robust_model_cascade_and_square_not_better(trained_mlp, batch, norm):
    x, y = batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Square-beats-white-box (or any other) warning
        result = AutoAttack(trained_mlp, norm.lower(), MIXED_EPS[norm], seed=0).run(x, y, batch_size=20)
    check_result(trained_mlp, x, y, result, norm, MIXED_EPS[norm])
    after = result.accuracy_after
    assert after["apgd-ce"] >= result.robust_accuracy
    assert 0 < result.robust_accuracy < after["clean"]
    assert after["square"] == after["fab-t"]  # black-box Square finds nothing the white-box attacks missed
    assert result.evaluations["apgd-ce"]["backward_rows"] > 0


def test_each_attack_gets_exactly_the_points_still_robust(trained_mlp, batch, monkeypatch):
    import rgb.attacks.autoattack as aa

    seen = {}
    original = aa.AutoAttack._attack

    def recording(self, name, x, y, *args):
        seen.setdefault(name, []).append(x.clone())
        return original(self, name, x, y, *args)

    monkeypatch.setattr(aa.AutoAttack, "_attack", recording)
    x, y = batch
    result = AutoAttack(trained_mlp, "Linf", MIXED_EPS["Linf"], steps=20, queries=100).run(x, y, batch_size=16)
    survivors = result.clean_correct.clone()
    for k, name in enumerate(result.attacks, start=1):
        received = torch.cat(seen[name]) if name in seen else torch.empty(0, *x.shape[1:])
        assert torch.equal(received, x[survivors])  # clean images of the still-robust points, in order
        survivors &= result.fooled_by != k


def test_fixed_seed_is_deterministic(trained_mlp, batch):
    x, y = batch
    settings = dict(seed=3, attacks=["apgd-ce", "square"], steps=20, queries=200)  # the two randomised attacks
    first = AutoAttack(trained_mlp, "L2", MIXED_EPS["L2"], **settings).run(x, y)
    second = AutoAttack(trained_mlp, "L2", MIXED_EPS["L2"], **settings).run(x, y)
    assert torch.equal(first.robust, second.robust) and torch.equal(first.x_adv, second.x_adv)


def test_the_stage_api_over_survivors_cut_anywhere_equals_run(trained_mlp, batch):
    """The stage API (clean_pass, attack_stage, finish) is the cascade of `run`: the same survivors handed over
    in pieces cut at batch boundaries give the same result bit for bit; an image already fooled is refused."""
    x, y = batch
    settings = dict(seed=3, attacks=["apgd-ce", "square"], steps=20, queries=100, batch_size=8)
    whole = AutoAttack(trained_mlp, "L2", MIXED_EPS["L2"], **settings).run(x, y)
    attack = AutoAttack(trained_mlp, "L2", MIXED_EPS["L2"], **settings)
    state = attack.clean_pass(x, y, 8)
    for stage in (1, 2):
        survivors = state.survivors()
        for piece in survivors.split(16):
            attack.attack_stage(stage, state, piece, 8)
    pieces = attack.finish(state, 8)
    for name in ("x_adv", "y_adv", "robust", "fooled_by", "forward_rows", "backward_rows"):
        assert torch.equal(getattr(whole, name), getattr(pieces, name)), name
    assert whole.evaluations == pieces.evaluations and whole.accuracy_after == pieces.accuracy_after
    fooled = (pieces.fooled_by > 0).nonzero().flatten()
    assert fooled.numel()  # MIXED_EPS fools some points of this model
    with pytest.raises(AttackError, match="already fooled"):
        attack.attack_stage(2, state, fooled[:1], 8)


def test_mode_restored_and_bad_inputs_refused(trained_mlp, batch):
    x, y = batch
    trained_mlp.train()
    AutoAttack(trained_mlp, "Linf", 0.01, attacks=["apgd-ce"]).run(x[:4], y[:4])
    assert trained_mlp.training
    trained_mlp.eval()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        AutoAttack(trained_mlp, "Linf", 0.01).run(x * 3 - 1, y)
    with pytest.raises(ValueError, match="norm must be one of"):
        AutoAttack(trained_mlp, "L3", 0.01)
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        AutoAttack(trained_mlp, "L2", 0.0)
    with pytest.raises(ValueError, match="version must be one of"):
        AutoAttack(trained_mlp, "L2", 0.5, version="strongest")
    with pytest.raises(ValueError, match="tail_rows must be an integer >= 0"):
        AutoAttack(trained_mlp, "L2", 0.5, tail_rows=-1)


def test_tail_rows_batch_the_targets_of_the_tail_within_noise(trained_mlp, batch):
    """tail_rows reaches the targeted attacks only and moves the robust count by noise at most."""
    x, y = batch
    assert {name for name, entry in ATTACKS.items() if "tail_rows" in entry.inputs} == {"apgd-t", "apgd-t-malt",
                                                                                         "fab-t"}
    runs = [AutoAttack(trained_mlp, "Linf", 0.07, tail_rows=rows, steps=20, queries=100).run(x, y)
            for rows in (0, 500)]
    assert 0 < int(runs[0].robust.sum()) < len(y)
    assert abs(int(runs[0].robust.sum()) - int(runs[1].robust.sum())) <= 1


class Probabilities(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).softmax(dim=1)


class Noisy(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) + torch.randn(x.shape[0], 10)


class NaNLogits(nn.Module):
    def forward(self, x):
        return torch.full((x.shape[0], 10), float("nan"))


def test_reference_checks_warn_or_refuse(trained_mlp, batch):
    x, y = batch
    with pytest.warns(UserWarning, match="probabilities"):
        AutoAttack(Probabilities(trained_mlp), "Linf", 0.01, attacks=["apgd-ce"], steps=10).run(x[:8], y[:8])
    with pytest.warns(UserWarning, match="changes between identical forward passes"):
        AutoAttack(Noisy(trained_mlp), "Linf", 0.001, attacks=["apgd-ce"], steps=10).run(x[:8], y[:8])
    with pytest.raises(AttackError, match="NaN/inf logits"):
        AutoAttack(NaNLogits(), "Linf", 0.01).run(x[:8], y[:8])


def test_few_classes_cap_targets_and_three_classes_refused():
    from rgb.models.toy import train_mlp

    five = train_mlp(n_classes=5, steps=100)
    x, y = separable_data(16, seed=2, n_classes=5)
    with pytest.warns(UserWarning, match=r"capped at 4 \(min\(9, K-1\)\)"):
        AutoAttack(five, "Linf", 0.15, steps=20, queries=100).run(x, y)
    three = train_mlp(n_classes=3, steps=50)
    x, y = separable_data(8, seed=2, n_classes=3)
    with pytest.raises(ValueError, match="at least 4 classes"):
        AutoAttack(three, "Linf", 0.05).run(x, y)
    result = AutoAttack(three, "Linf", 0.05, attacks=["apgd-ce", "square"]).run(x, y)  # CE needs no 4 classes
    assert result.attacks == ["apgd-ce", "square"]


def test_bf16_precision_counts_only_fp32_verified_successes(trained_mlp, batch):
    x, y = batch
    result = AutoAttack(trained_mlp, "Linf", MIXED_EPS["Linf"], precision="bf16", steps=20,
                        attacks=["apgd-ce", "apgd-t"]).run(x, y)
    check_result(trained_mlp, x, y, result, "Linf", MIXED_EPS["Linf"])
    assert result.precision == "bf16"


def test_rand_version_uses_eot_and_skips_the_randomness_check(trained_mlp, batch):
    x, y = batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = AutoAttack(Noisy(trained_mlp), "Linf", LARGE_EPS["Linf"], version="rand", steps=10).run(x, y)
    assert result.attacks == ["apgd-ce", "apgd-dlr"] and result.version == "rand"
    assert within_budget(result.x_adv - x, "Linf", LARGE_EPS["Linf"]).all()
    assert result.robust_accuracy <= 0.2
    # 20 EoT passes per gradient: 11 gradients (start + 10 steps) per attacked image at least
    assert result.evaluations["apgd-ce"]["backward_rows"] >= 20 * 11 * int(result.clean_correct.sum()) * 0.5
    with pytest.raises(ValueError, match="subset of"):
        AutoAttack(trained_mlp, "Linf", 0.1, version="rand", attacks=["square"])


@pytest.mark.slow
def test_plus_version_runs_its_cascade_and_is_at_least_as_strong(trained_mlp, batch):
    x, y = batch
    standard = AutoAttack(trained_mlp, "L2", MIXED_EPS["L2"], seed=0).run(x, y)
    plus = AutoAttack(trained_mlp, "L2", MIXED_EPS["L2"], version="plus", seed=0).run(x, y, batch_size=16)
    check_result(trained_mlp, x, y, plus, "L2", MIXED_EPS["L2"])
    assert plus.attacks == list(VERSIONS["plus"].attacks) and plus.version == "plus"
    assert list(plus.accuracy_after) == ["clean", *VERSIONS["plus"].attacks]
    assert 0 < plus.robust_accuracy <= standard.robust_accuracy + 1 / len(y)
    survivors_for_fab = round(plus.accuracy_after["apgd-dlr"] * len(y))
    if survivors_for_fab:  # untargeted FAB: one backward pass per class and step on each point it attacks
        assert plus.evaluations["fab"]["backward_rows"] >= 10 * survivors_for_fab


def test_plus_at_l1_warns_that_the_eps_schedule_is_off(trained_mlp, batch):
    x, y = batch
    with pytest.warns(UserWarning, match="'plus' at L1 runs without the L1 eps schedule"):
        AutoAttack(trained_mlp, "L1", MIXED_EPS["L1"], version="plus", attacks=["apgd-ce"], steps=5).run(x, y)


def test_versions_are_built_from_the_attack_table():
    assert VERSIONS["standard"].attacks == ("apgd-ce", "apgd-t", "fab-t", "square")
    assert is_standard("standard") and not any(is_standard(v) for v in VERSIONS if v != "standard")
    assert not is_standard("no-such-version")
    assert all(step.attack in ATTACKS for version in VERSIONS.values() for step in version.steps)
    l1_targets = VERSIONS["standard"].steps[1].params_at("L1")
    assert l1_targets == {"n_targets": 5, "eps_schedule": "largereps"}
    assert VERSIONS["standard"].steps[1].params_at("Linf") == {"n_targets": 9}
    assert VERSIONS["standard"].steps[0].params_at("L2") == {"loss": "ce"}
    with pytest.raises(ValueError, match="unknown attack"):
        Step("no-such-attack")
    with pytest.raises(ValueError, match="unknown cascade inputs"):
        AttackEntry(ATTACKS["square"].attack, frozenset({"temperature"}), ATTACKS["square"].worst_rows)
    with pytest.raises(TypeError):
        ATTACKS["apgd-ce"].params["loss"] = "dlr"  # table rows are shared and read-only


def test_every_table_attack_follows_the_protocol(trained_mlp, batch):
    x, y = batch[0][:6], batch[1][:6]
    shared = {"clean_logits": trained_mlp(x), "generator": 0, "n_iter": 3, "n_queries": 5}
    for name, entry in ATTACKS.items():
        inputs = {key: value for key, value in shared.items() if key in entry.inputs}
        steps = []
        result = entry.attack(trained_mlp, x, y, norm="L2", eps=0.5, progress=lambda *p: steps.append(p), **inputs,
                              **entry.params)
        assert isinstance(result, AttackResult), name
        assert result.x_adv.shape == x.shape and result.fooled.shape == y.shape, name
        assert result.forward_rows > 0 and result.backward_rows >= 0, name
        assert steps and steps == sorted(steps) and all(p[-2] <= p[-1] for p in steps), name


def test_progress_reports_stages_and_steps_within_a_batch(trained_mlp, batch):
    """Issue 13 item 22: a long batch is never silent: every stage starts with its name, then step positions."""
    x, y = batch
    calls = []
    result = AutoAttack(trained_mlp, "Linf", MIXED_EPS["Linf"], seed=0, steps=12, queries=40, progress_interval=0,
                        progress=lambda name, *position: calls.append((name, position))).run(x, y, batch_size=32)
    assert 0 < result.robust_accuracy  # every stage ran on the one batch
    stages = list(dict.fromkeys(name for name, _ in calls))
    assert stages == result.attacks == ["apgd-ce", "apgd-t", "fab-t", "square"]
    for stage in stages:
        positions = [position for name, position in calls if name == stage]
        assert positions[0] == ()  # the stage's start
        steps = positions[1:]
        assert len(steps) >= 10 and steps == sorted(steps) and len(set(steps)) == len(steps), stage
        assert all(step[-2] <= step[-1] for step in steps), stage
    assert {len(p) for name, p in calls if name in ("apgd-t", "fab-t") and p} == {4}  # target, n_targets, step, n
    assert [p for name, p in calls if name == "apgd-ce"][1:3] == [(1, 12), (2, 12)]
    assert [p for name, p in calls if name == "fab-t"][1][1] == 9

    throttled = []
    AutoAttack(trained_mlp, "Linf", MIXED_EPS["Linf"], seed=0, steps=12, queries=40, progress_interval=3600,
               progress=lambda name, *position: throttled.append((name, position))).run(x, y, batch_size=32)
    assert throttled == [(stage, ()) for stage in stages]  # nothing between the stage starts within an hour


def test_images_are_reported_as_they_leave_the_cascade(trained_mlp, batch):
    """Issue 24: a bar counts images as they leave a batch (fooled or finished), not once per batch."""
    x, y = batch
    left, seen = [], []
    result = AutoAttack(trained_mlp, "Linf", MIXED_EPS["Linf"], seed=0, steps=12, queries=40, on_leave=left.append,
                        progress=lambda name, *position: seen.append((name, sum(left)))).run(x, y, batch_size=32)
    assert sum(left) == len(y) and all(n > 0 for n in left)
    assert left[-1] == int(result.robust.sum()) > 0  # the robust ones leave after the last attack
    fooled_by_first = int((result.fooled_by == 1).sum())
    assert fooled_by_first > 0 and dict(seen)["apgd-t"] >= fooled_by_first  # ... the fooled ones before that


def test_stage_positions_read_as_words():
    from rgb.attacks.registry import describe_stage

    assert describe_stage("apgd-t", (3, 9, 59, 100)) == "apgd-t target 3/9 step 59/100"
    assert describe_stage("fab-t", (1, 9, 2, 100)) == "fab-t target 1/9 step 2/100"
    assert describe_stage("apgd-ce", (12, 500)) == "apgd-ce step 12/500"
    assert describe_stage("square", (10, 5000)) == "square query 10/5000" and describe_stage("square") == "square"
    assert describe_stage("autoattack-reference", (1, 2)) == "autoattack-reference 1/2"  # outside the table


def test_threat_model_checks_are_errors(batch):
    x = batch[0][:4]
    check_threat_model(x, x.clone(), "Linf", 0.1, unchanged=torch.ones(4, dtype=torch.bool))
    with pytest.raises(AttackError, match="exceeds the Linf budget"):
        check_threat_model(x, (x + 0.2).clamp(0, 1), "Linf", 0.1)
    with pytest.raises(AttackError, match=r"leaves \[0, 1\]"):
        check_threat_model(x, x + 2, "L2", 100.0)
    with pytest.raises(AttackError, match="NaN"):
        check_threat_model(x, torch.full_like(x, float("nan")), "L1", 1.0)
    moved = x.clone()
    moved[0, 0, 0, 0] = 1 - moved[0, 0, 0, 0]
    with pytest.raises(AttackError, match="robust point was returned perturbed"):
        check_threat_model(x, moved, "L1", 1.0, unchanged=torch.tensor([True, False, False, False]))


@pytest.mark.slow
def test_threat_model_check_holds_under_python_O():
    script = ("import torch\nfrom rgb.attacks import AttackError, check_threat_model\nx = torch.full((2, 3, 4, 4), 0.5)\n"
              "try:\n    check_threat_model(x, x + 0.3, 'Linf', 0.1)\nexcept AttackError:\n    print('refused')\n")
    out = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "refused"


class ViewsItsInput(nn.Module):
    """A conv model that calls `.view` on its input: NHWC inputs break it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        return self.head(x.view(x.shape[0], -1)) + 0 * self.conv(x).mean()


def test_conv_models_get_nhwc_inputs_on_the_cpu_and_the_same_flags():
    """input_format="auto": the attacks call a conv model on channels_last copies (float rounding only), a model
    without convolutions as given; the clean pass and the verification always see the images as given."""
    from user_models import small_cnn

    from rgb.attacks.model_calls import ChannelsLastInputs

    model = small_cnn().eval()
    x, y = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 10
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].is_contiguous()))
    runs = {fmt: AutoAttack(model, "Linf", 0.03, attacks=["apgd-ce", "apgd-t"], input_format=fmt, capture="eager",
                            steps=10)
            for fmt in ("auto", "contiguous")}
    results = {fmt: attack.run(x, y) for fmt, attack in runs.items()}
    assert isinstance(runs["auto"].attack_model, ChannelsLastInputs) and runs["contiguous"].attack_model is model
    assert not all(seen) and any(seen)  # attacks saw NHWC, the clean pass and verification NCHW
    assert torch.equal(results["auto"].clean_correct, results["contiguous"].clean_correct)
    assert abs(int(results["auto"].robust.sum()) - int(results["contiguous"].robust.sum())) <= 1
    assert results["auto"].evaluations["clean"]["forward_rows"] == len(x) + 1  # the probe
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    attack = AutoAttack(mlp, "Linf", 0.03, attacks=["apgd-ce"], capture="eager")
    attack.run(x, y)
    assert attack.attack_model is mlp  # no convolution: nothing to gain


def test_a_model_refusing_nhwc_inputs_falls_back_or_is_named():
    model = ViewsItsInput().eval()
    x, y = torch.rand(4, 3, 8, 8), torch.arange(4)
    attack = AutoAttack(model, "Linf", 0.03, attacks=["apgd-ce"], capture="eager")
    attack.run(x, y)
    assert attack.attack_model is model
    with pytest.raises(ValueError, match="refuses NHWC inputs"):
        AutoAttack(model, "Linf", 0.03, attacks=["apgd-ce"], input_format="channels_last").run(x, y)
    with pytest.raises(ValueError, match="input_format must be one of"):
        AutoAttack(model, "Linf", 0.03, input_format="nhwc")


def test_the_attacks_call_a_trace_of_the_model_on_the_cpu_with_the_same_results_bit_for_bit():
    """capture="auto" on the CPU in fp32: the attacks call a TorchScript trace of the model (the same ATen calls,
    without the Python of its modules), checked against the model on a probe, and every number is the eager one."""
    from user_models import small_cnn

    from rgb.attacks.model_calls import ChannelsLastInputs, TracedModel

    model = small_cnn().eval()
    x, y = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.arange(6) % 10
    attacks = {capture: AutoAttack(model, "L2", 0.5, attacks=["apgd-ce", "apgd-t", "square"], steps=10, queries=30,
                                   capture=capture) for capture in ("auto", "eager")}
    results = {capture: attack.run(x, y) for capture, attack in attacks.items()}
    assert isinstance(attacks["auto"].attack_model, TracedModel) and results["auto"].capture == "trace"
    assert isinstance(attacks["eager"].attack_model, ChannelsLastInputs) and results["eager"].capture == "eager"
    traced, eager = results["auto"], results["eager"]
    assert torch.equal(traced.x_adv, eager.x_adv) and torch.equal(traced.fooled_by, eager.fooled_by)
    assert {k: v for k, v in traced.evaluations.items() if k != "clean"} == \
        {k: v for k, v in eager.evaluations.items() if k != "clean"}
    # The probes: the NHWC one (1 row), the trace (2 rows), both models at 1 row (forward and backward) and 3 rows.
    assert traced.evaluations["clean"] == {"forward_rows": len(x) + 1 + 2 + 2 + 6, "backward_rows": 2}
    assert eager.evaluations["clean"] == {"forward_rows": len(x) + 1, "backward_rows": 0}
    spent = sum(v["backward_rows"] for v in traced.evaluations.values())
    assert float(traced.backward_rows.sum()) == pytest.approx(spent)


class BakesItsBatchSize(nn.Module):
    """A model whose Python branch on the batch size a trace would bake in."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        logits = self.head(x.flatten(1))
        return logits * 2 if x.shape[0] == 2 else logits


class DetachesABranch(nn.Module):
    """A branch under no_grad: the model's gradients skip it, a trace's would not (it records no grad mode)."""

    def __init__(self):
        super().__init__()
        self.head, self.shift = nn.Linear(3 * 8 * 8, 10), nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        with torch.no_grad():
            shift = self.shift(x.flatten(1))
        return self.head(x.flatten(1)) + shift


class ScalesByItsBrightest(nn.Module):
    """A per-batch statistic read as a Python number: a trace bakes in its example's value."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        return self.head(x.flatten(1) / float(x.detach().max()))


class ReturnsADict(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        return {"logits": self.head(x.flatten(1))}


def test_a_trace_that_differs_or_fails_keeps_the_model_or_is_named():
    x, y = torch.rand(4, 3, 8, 8), torch.arange(4)
    model = BakesItsBatchSize().eval()
    attack = AutoAttack(model, "Linf", 0.03, attacks=["apgd-ce"])
    attack.run(x, y)
    assert attack.attack_model is model
    with pytest.raises(ValueError, match="differ from the model's at a batch of 1"):
        AutoAttack(model, "Linf", 0.03, attacks=["apgd-ce"], capture="trace").run(x, y)
    with pytest.raises(ValueError, match="cannot be traced"):
        attack_model(ReturnsADict().eval(), x, torch.zeros(4, 10), AttackOptions(capture="trace"),
                     torch.device("cpu"), deterministic=True)
    for odd, why in ((DetachesABranch(), "at a batch of 1"), (ScalesByItsBrightest(), "at a batch of")):
        odd.eval()
        attack = AutoAttack(odd, "Linf", 0.03, attacks=["apgd-ce"])
        assert attack.run(x, y).capture == "eager" and attack.attack_model is odd
        with pytest.raises(ValueError, match=f"differ from the model's {why}"):
            AutoAttack(odd, "Linf", 0.03, attacks=["apgd-ce"], capture="trace").run(x, y)
    with pytest.raises(ValueError, match="capture must be one of"):
        AutoAttack(model, "Linf", 0.03, capture="script")
    with pytest.raises(ValueError, match="needs precision='fp32'"):
        AutoAttack(model, "Linf", 0.03, capture="trace", precision="bf16")


def test_no_trace_on_bf16_or_for_randomised_models(trained_mlp, batch):
    x, y = batch
    for kwargs in ({"precision": "bf16"}, {"version": "rand"}):
        attack = AutoAttack(trained_mlp, "Linf", 0.03, attacks=["apgd-ce"], steps=5, **kwargs)
        attack.run(x, y)
        assert attack.attack_model is trained_mlp
    attack = AutoAttack(trained_mlp, "Linf", 0.03, attacks=["apgd-ce"], steps=5)
    attack.run(x, y)
    assert attack.attack_model is not trained_mlp


class CountsItsCalls(nn.Module):
    """A model that counts its gradient-taking calls in a Python attribute (the attacks' calls take gradients)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 8 * 8, 10)
        self.calls = 0

    def forward(self, x):
        self.calls += torch.is_grad_enabled()
        return self.head(x.flatten(1))


def test_capture_auto_keeps_a_model_with_hooks_or_python_counters_eager_and_says_why():
    """Issue 33: a trace runs neither forward hooks nor a forward's Python, so under capture="auto" the user's
    instrumentation went blind during the attack (the results were the same). Such a model is attacked eager, the
    reason in the result's warnings (and so in summary.json), and capture="trace" refuses it with that reason."""
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    hooked = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10)).eval()
    seen = []
    hooked[1].register_forward_hook(lambda module, inputs, output: seen.append(torch.is_grad_enabled()))
    counting = CountsItsCalls().eval()
    cases = ((hooked, lambda: sum(seen), "forward hook on '1'"), (counting, lambda: counting.calls, "'calls'"))
    for model, count, why in cases:
        with torch.no_grad():
            y = model(x).argmax(1)  # every point correct: the attack runs its steps
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            result = AutoAttack(model, "Linf", 0.001, attacks=["apgd-ce"], steps=20).run(x, y)
        assert result.capture == "eager"
        assert count() >= 20  # every attack step called the model's own Python
        assert any("capture='auto' attacked the model eager" in w and why in w for w in result.warnings)
        with pytest.raises(ValueError, match=f"capture='trace': .*{why}"):
            AutoAttack(model, "Linf", 0.001, attacks=["apgd-ce"], steps=20, capture="trace").run(x, y)


def test_a_global_module_hook_keeps_capture_auto_eager():
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10)).eval()
    with torch.no_grad():
        y = model(x).argmax(1)
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda *_: seen.append(torch.is_grad_enabled()))
    try:
        with warnings.catch_warnings(record=True):
            result = AutoAttack(model, "Linf", 0.001, attacks=["apgd-ce"], steps=20).run(x, y)
    finally:
        handle.remove()
    assert result.capture == "eager" and sum(seen) >= 20
    assert any("global forward hook" in w for w in result.warnings)


def test_tf32_and_cudnn_benchmark_agree_with_fp32_on_the_cpu(trained_mlp, batch):
    """The CPU has no TF32 and no cudnn: the opt-ins must give fp32's results there (on a GPU, robust accuracy
    may not exceed fp32's by more than the agreement allowance: tests/test_gpu.py), and leave torch's flags."""
    x, y = batch
    fp32 = AutoAttack(trained_mlp, "Linf", MIXED_EPS["Linf"], attacks=["apgd-ce", "apgd-t"], steps=20).run(x, y)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark
    fast = AutoAttack(trained_mlp, "Linf", MIXED_EPS["Linf"], precision="tf32", cudnn_benchmark=True, steps=20,
                      attacks=["apgd-ce", "apgd-t"]).run(x, y)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark) == before
    check_result(trained_mlp, x, y, fast, "Linf", MIXED_EPS["Linf"])
    assert fast.precision == "tf32" and torch.equal(fast.robust, fp32.robust)


@pytest.mark.parametrize("make, message", [
    (lambda m: AutoAttack(m, "Linf", float("nan")), r"Linf eps must be a finite number > 0 .* got nan"),
    (lambda m: AutoAttack(m, "L2", float("inf")), r"L2 eps must be a finite number > 0 .* got inf"),
    (lambda m: AutoAttack(m, "L1", -1.0), r"L1 eps must be a finite number > 0 .* got -1.0"),
    (lambda m: AutoAttack(m, "Linf", "a"), r"Linf eps must be a finite number > 0 .* got 'a'"),
    (lambda m: AutoAttack(m, "L3", 0.1), r"norm must be one of"),
    (lambda m: AutoAttack(m, "Linf", 0.1, steps=0), r"steps must be an integer >= 1, got 0"),
])
def test_degenerate_budgets_and_options_are_one_line_user_errors(trained_mlp, make, message):
    with raises_one_line(UserError, match=message):
        make(trained_mlp)


@pytest.mark.parametrize("inputs, batch_size, message", [
    (lambda x, y: (x[:0], y[:0]), None, "no images to attack: x holds 0 images"),
    (lambda x, y: (x[0], y), None, r"expected x \(N,C,H,W\) and y \(N,\)"),
    (lambda x, y: (x, y[:3]), None, r"expected x \(N,C,H,W\) and y \(N,\), got \(32, 3, 8, 8\) and \(3,\)"),
    (lambda x, y: (x, y.float()), None, "labels y must be integer class indices"),
    (lambda x, y: (x * 255, y), None, r"inputs must lie in \[0, 1\], got values in \[48.65, 201.5\]"),
    (lambda x, y: (x * float("nan"), y), None, r"inputs must lie in \[0, 1\], got NaN"),
    (lambda x, y: (x.tolist(), y), None, "x and y must be torch tensors, got list and Tensor"),
    (lambda x, y: (x, y), 0, "batch_size must be an integer >= 1, got 0"),
    (lambda x, y: (x, y), -4, "batch_size must be an integer >= 1, got -4"),
])
def test_degenerate_inputs_to_run_are_one_line_user_errors(trained_mlp, batch, inputs, batch_size, message):
    """Each once a traceback (an empty batch, a negative batch size) or silently taken (batch_size=0 ran at 500)."""
    attack = AutoAttack(trained_mlp, "Linf", 0.01, attacks=["apgd-ce"])
    with raises_one_line(AttackInputError, match=message):
        attack.run(*inputs(*batch), batch_size=batch_size)
    with raises_one_line(AttackInputError, match="batch_size must be an integer >= 1, got 0"):
        AutoAttack(trained_mlp, "Linf", 0.01, attacks=["apgd-ce"], batch_size=0).run(*batch)
