"""APGD-T and FAB-T take their targets from one function with one tie rule, the reference AutoAttack's."""

import importlib

import pytest
import torch
from torch import nn

from rgb.attacks.apgd import apgd_targeted
from rgb.attacks.common import runner_up_targets
from rgb.attacks.fab import fab_targeted

apgd_module = importlib.import_module("rgb.attacks.apgd")
fab_module = importlib.import_module("rgb.attacks.fab")

# Class 1 wins in both rows; the runner-up logits tie (three 3s in row 0; two 5s, then three 2s in row 1).
TIED = torch.tensor([[1.0, 7.0, 3.0, 3.0, 3.0, 0.0], [2.0, 9.0, 5.0, 2.0, 5.0, 2.0]])
# Of equal logits the higher class index ranks first.
TIED_TARGETS = [[4, 3, 2, 0, 5], [4, 2, 5, 3, 0]]


class ConstantLogits(nn.Module):
    """Row 0 of TIED whatever the input (zero gradient): nothing is ever fooled, so every target is tried."""

    def forward(self, x):
        return TIED[:1].expand(x.shape[0], -1) + 0 * x.flatten(1).sum(1, keepdim=True)


def test_targets_are_the_runner_up_classes_in_order():
    logits = torch.tensor([[0.0, 5.0, 3.0, 9.0, 1.0], [4.0, 3.0, 2.0, 1.0, 0.0]])
    assert runner_up_targets(logits, 4).tolist() == [[1, 2, 4, 0], [1, 2, 3, 4]]
    with pytest.raises(ValueError, match="n_targets must be in"):
        runner_up_targets(logits, 5)


def test_ties_rank_as_the_reference_reads_its_ascending_sort():
    """The reference takes `logits.sort(dim=1)[1][:, -rank]` for ranks 2, 3, ..."""
    assert runner_up_targets(TIED, 5).tolist() == TIED_TARGETS
    reference = torch.stack([TIED.sort(dim=1, stable=True)[1][:, -rank] for rank in range(2, 7)], dim=1)
    assert reference.tolist() == TIED_TARGETS


@pytest.mark.filterwarnings("ignore:.*zero gradient")
def test_apgd_t_and_fab_t_attack_the_same_targets_on_tied_logits(monkeypatch):
    x, y = torch.full((2, 3, 4, 4), 0.5), torch.tensor([1, 1])
    apgd_targets, fab_targets = [], []

    def recording_apgd(*args, **kwargs):
        apgd_targets.append(kwargs["y_target"].clone())
        return apgd(*args, **kwargs)

    def recording_fab_run(model, x0, y0, target, **kwargs):
        fab_targets.append(target.clone())
        return run_target(model, x0, y0, target, **kwargs)

    apgd, run_target = apgd_module.apgd, fab_module._run_target
    monkeypatch.setattr(apgd_module, "apgd", recording_apgd)
    monkeypatch.setattr(fab_module, "_run_target", recording_fab_run)
    model = ConstantLogits()
    apgd_targeted(model, x, y, norm="Linf", eps=0.1, n_targets=5, n_iter=2, clean_logits=TIED, generator=0)
    fab_targeted(model, x, y, norm="Linf", eps=0.1, n_targets=5, n_iter=2, clean_logits=TIED)
    assert torch.stack(apgd_targets, dim=1).tolist() == TIED_TARGETS
    assert torch.stack(fab_targets, dim=1).tolist() == TIED_TARGETS
