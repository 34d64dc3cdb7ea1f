"""Strict fp32 where a record says fp32 (issue 54 item 6): PyTorch lets cuDNN use TF32 for convolutions by default,
so every model call behind an fp32 number runs with TF32 off for convolutions and matrix products, whatever the
process's flags, and leaves them as it found them; `precision="tf32"` is the one way to TF32. The CPU has no TF32,
so these tests read torch's backend flags inside the model's forward."""

import sys
import types

import pytest
import torch
from torch import nn

from rgb.attacks.autoattack import AutoAttack
from rgb.evaluation.model_eval import predict


class FlagRecorder(nn.Module):
    """The wrapped model, noting at each forward the TF32 flags (matmul, cudnn) and whether an attack of the cascade
    (AutoAttack._attack) is the caller, rather than the clean pass, the checks or a success's re-check."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.seen = model, []

    def forward(self, x):
        frame, callers = sys._getframe(1), set()
        while frame is not None:
            callers.add(frame.f_code.co_name)
            frame = frame.f_back
        self.seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, "_attack" in callers))
        return self.model(x)


@pytest.fixture
def tf32_on_globally():
    """The process allows TF32 everywhere (cuDNN's default for convolutions, and what a user may set)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_fp32_attack_runs_every_model_call_without_tf32_and_restores_the_flags(toy, tf32_on_globally):
    model, x, y = toy
    recorder = FlagRecorder(model)
    AutoAttack(recorder, "Linf", 0.05, attacks=["apgd-ce"], steps=5, capture="eager").run(x[:8], y[:8])
    assert any(attack for *_, attack in recorder.seen) and any(not attack for *_, attack in recorder.seen)
    assert all((matmul, cudnn) == (False, False) for matmul, cudnn, _ in recorder.seen)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)


def test_tf32_precision_is_tf32_in_the_attacks_only(toy):
    model, x, y = toy
    recorder = FlagRecorder(model)
    AutoAttack(recorder, "Linf", 0.05, attacks=["apgd-ce"], steps=5, precision="tf32",
               capture="eager").run(x[:8], y[:8])
    attack_calls = {(matmul, cudnn) for matmul, cudnn, attack in recorder.seen if attack}
    other_calls = {(matmul, cudnn) for matmul, cudnn, attack in recorder.seen if not attack}
    assert attack_calls == {(True, True)} and other_calls == {(False, False)}


def test_evaluation_predictions_run_without_tf32(toy, tf32_on_globally):
    model, x, y = toy
    recorder = FlagRecorder(model)
    split = [(x[i], y[i], i) for i in range(len(x))]
    request = types.SimpleNamespace(batch_size=8, device="cpu", max_images=None)
    out = predict(recorder, split, request, "test")
    assert len(out["pred"]) == len(x) and len(recorder.seen) == 4
    assert all((matmul, cudnn) == (False, False) for matmul, cudnn, _ in recorder.seen)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
