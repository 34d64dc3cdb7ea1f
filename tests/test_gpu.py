"""GPU-gated checks (skipped without CUDA; run by benchmarks/gpu_check.sh on a lent GPU)."""

import pytest
import torch

from rgb.attacks import apgd
from rgb.attacks.autoattack import AutoAttack, within_budget
from toy_models import separable_data

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


def test_training_step_with_bf16_autocast(mini_dir, tmp_path):
    from hydra import compose, initialize_config_dir

    from rgb.training import train
    from conftest import REPO_ROOT

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", return_hydra_config=True, overrides=[
            f"data.source={mini_dir}", f"paths.root_dir={tmp_path}", "trainer=gpu", "loss=trades",
            "+trainer.fast_dev_run=2", f"run_dir={tmp_path}/run",
        ])
    assert cfg.trainer.precision == "bf16-mixed"
    value = train(cfg)
    assert value == value  # not NaN
