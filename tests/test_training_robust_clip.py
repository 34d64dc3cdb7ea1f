"""loss=tecoa and loss=fare: robust fine-tuning of an open_clip image tower under the fixed prompt-built head, with
the existing trainer, on the mini benchmark and a tiny random-weight open_clip model (seconds)."""

import hydra
import pytest
import torch

from helpers import compose_tiny_clip, resolved
from rgb.models import create_openclip_classifier, load_with_meta
from rgb.models.embedded_clip import EMBEDDED_ARCH, register_embedded_architecture
from rgb.commands.train import train, training_request
from rgb.commands.train_config import validate_config
from rgb.training.config import TrainingConfigError
from rgb.training.losses import FARE, EmbeddingAttack, build_loss, squared_distance
from rgb.training.module import RobustFinetuneModule
from rgb.training.zeroshot import initialise_head



def test_fare_inner_attack_stays_in_the_ball_and_moves_the_embedding():
    register_embedded_architecture()
    model = create_openclip_classifier(EMBEDDED_ARCH, 10).eval()
    x = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        target = model.tower_features(x)
    torch.manual_seed(0)
    attack = EmbeddingAttack(eps=4 / 255, n_iter=5)
    x_adv = attack(model.tower_features, x, target)
    assert float((x_adv - x).abs().max()) <= 4 / 255 + 1e-6 and x_adv.min() >= 0 and x_adv.max() <= 1
    with torch.no_grad():
        moved = squared_distance(model.tower_features(x_adv), target)
        noise = squared_distance(model.tower_features((x + 4 / 255 * torch.randn_like(x).sign()).clamp(0, 1)), target)
    assert bool((moved > noise).all())  # the attack, not the random start, moves the embedding
    l2 = EmbeddingAttack(norm="L2", eps=0.1, n_iter=3)(model.tower_features, x, target)
    assert float((l2 - x).flatten(1).norm(dim=1).max()) <= 0.1 + 1e-5
    with pytest.raises(ValueError, match="Linf and L2"):
        EmbeddingAttack(norm="L1")


def test_fare_loss_is_zero_at_the_start_on_clean_images_and_keeps_a_frozen_reference():
    register_embedded_architecture()
    model = create_openclip_classifier(EMBEDDED_ARCH, 10)
    loss = build_loss("fare", attack={"eps": 4 / 255, "n_iter": 2})
    assert isinstance(loss, FARE)
    module = RobustFinetuneModule(model, {"name": "fare", "attack": {"eps": 4 / 255, "n_iter": 2}}, "full_finetune",
                                  {"head_lr": 1e-3, "backbone_lr": 1e-4})
    assert not any(p.requires_grad for p in module.reference.parameters())
    assert not any(p.requires_grad for p in module.model.classifier.parameters())  # the prompt head stays
    x, y = torch.rand(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    value, clean, adv = module.loss_and_logits(x, y)
    assert clean is None and adv.shape == (4, 10) and float(value.detach()) > 0
    with torch.no_grad():  # the reference is the starting tower (up to eval-mode attention kernels)
        assert float(squared_distance(module.model.tower_features(x), module.reference.tower_features(x)).max()) < 1e-8


@pytest.mark.parametrize("loss", ["tecoa", "fare"])
def test_robust_clip_losses_train_the_image_tower_only_and_export_a_zeroshot_classifier(tmp_path, mini_dir, loss):
    cfg = compose_tiny_clip(tmp_path, mini_dir, f"loss={loss}", "strategy=full_finetune", "head_init=zeroshot",
                        "debug=fdr", "data.batch_size=16", "loss.attack.n_iter=2", "optim.backbone_lr=1e-3")
    start = hydra.utils.instantiate(cfg.model)
    initialise_head(start, training_request(cfg).model, hydra.utils.instantiate(cfg.data))
    train(cfg)
    model, meta = load_with_meta(tmp_path / "run")
    assert meta["loss"]["name"] == loss and meta["family"] == "openclip"
    assert torch.equal(model.classifier.weight, start.classifier.weight)  # still the prompt-built head
    before, after = start.backbone.visual.state_dict(), model.backbone.visual.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the image tower learned


def test_robust_clip_losses_need_the_prompt_head_and_a_trainable_tower(tmp_path, mini_dir):
    with pytest.raises(TrainingConfigError, match="loss=fare .*add head_init=zeroshot"):
        validate_config(resolved(compose_tiny_clip(tmp_path, mini_dir, "loss=fare")))
    with pytest.raises(TrainingConfigError, match="strategy=linear_probe would train nothing"):
        validate_config(resolved(compose_tiny_clip(tmp_path, mini_dir, "loss=tecoa", "head_init=zeroshot",
                                               "strategy=linear_probe")))
    with pytest.raises(TrainingConfigError, match="loss.attack.step_size must be null or a finite number > 0"):
        validate_config(resolved(compose_tiny_clip(tmp_path, mini_dir, "loss=fare", "head_init=zeroshot",
                                               "loss.attack.step_size=-1")))
