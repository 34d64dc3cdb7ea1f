"""GPU-gated checks (skipped without CUDA; run by benchmarks/gpu_check.sh on a lent GPU)."""

import pytest
import torch

from rgb.attacks import apgd
from rgb.attacks.autoattack import AutoAttack, within_budget
from rgb.models.toy import separable_data

pytestmark = pytest.mark.gpu

EPS = {"Linf": 0.07, "L2": 0.8, "L1": 6.0}


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_autoattack_on_cuda_keeps_every_invariant(trained_mlp, norm):
    model = trained_mlp.to("cuda")
    x, y = separable_data(64, seed=1)
    result = AutoAttack(model, norm, EPS[norm], device="cuda").run(x, y, batch_size=32)
    assert result.x_adv.device.type == "cpu"  # results come back to the host
    assert within_budget(result.x_adv - x, norm, EPS[norm]).all()
    with torch.no_grad():
        correct = model(result.x_adv.cuda()).argmax(1).cpu() == y
    assert torch.equal(correct, result.robust)
    assert 0 < result.robust_accuracy < result.accuracy_after["clean"]
    trained_mlp.to("cpu")


def test_apgd_flags_agree_between_cpu_and_cuda_without_random_start(trained_mlp):
    x, y = separable_data(64, seed=1)
    cpu = apgd(trained_mlp.to("cpu"), x, y, norm="Linf", eps=EPS["Linf"], random_start=False)
    gpu = apgd(trained_mlp.to("cuda"), x.cuda(), y.cuda(), norm="Linf", eps=EPS["Linf"], random_start=False)
    trained_mlp.to("cpu")
    disagree = (cpu.fooled != gpu.fooled.cpu()).float().mean()
    assert disagree <= 0.05  # float rounding differs between devices; the attack must not


def test_bf16_autoattack_successes_are_fp32_verified(trained_mlp):
    model = trained_mlp.to("cuda")
    x, y = separable_data(64, seed=1)
    result = AutoAttack(model, "Linf", EPS["Linf"], device="cuda", precision="bf16").run(x, y)
    with torch.no_grad():
        correct = model(result.x_adv.cuda()).float().argmax(1).cpu() == y
    assert torch.equal(correct, result.robust)
    trained_mlp.to("cpu")


def test_training_steps_with_bf16_autocast():
    """A real Lightning fit (TRADES, inner APGD under the same autocast) on synthetic 32x32 data."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from rgb.models import create_model
    from rgb.training import RobustFinetuneModule

    model = create_model("test_resnet", num_classes=10, pretrained=False)
    module = RobustFinetuneModule(model, loss={"name": "trades", "beta": 1.0,
                                               "attack": {"norm": "Linf", "eps": 4 / 255, "n_iter": 3}},
                                  strategy="full_finetune",
                                  optim={"backbone_lr": 1e-3, "head_lr": 1e-3, "backbone_weight_decay": 0.0,
                                         "head_weight_decay": 0.0})
    x, y = torch.rand(64, 3, 32, 32), torch.randint(0, 10, (64,))
    loader = DataLoader(TensorDataset(x, y, torch.arange(64)), batch_size=16)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0)
    trainer.fit(module, loader)
    assert trainer.global_step == 4
    assert any(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters()))
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_fast_precisions_are_never_more_robust_than_fp32_beyond_the_allowance(trained_mlp, precision):
    """The opt-ins outside the protocol: every success is fp32-verified, so a weaker attack can only leave more
    points robust; by no more than the agreement allowance (5 points in 100, as between CPU and CUDA above)."""
    model = trained_mlp.to("cuda")
    x, y = separable_data(64, seed=1)
    fp32 = AutoAttack(model, "Linf", EPS["Linf"], device="cuda").run(x, y)
    fast = AutoAttack(model, "Linf", EPS["Linf"], device="cuda", precision=precision, cudnn_benchmark=True).run(x, y)
    trained_mlp.to("cpu")
    assert fast.precision == precision
    assert fast.robust_accuracy <= fp32.robust_accuracy + 0.05
