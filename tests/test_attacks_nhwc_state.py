"""#54.2: attacks given NHWC images (input_format="channels_last" keeps the state NHWC) return the same bits as
given NCHW images, where the model sees NHWC copies either way."""

import pytest
import torch
from torch import nn

from rgb.attacks.apgd import apgd
from rgb.attacks.model_calls import ChannelsLastInputs
from rgb.attacks.projections import project_l1_values
from rgb.attacks.square import square


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).eval()


@pytest.mark.parametrize("norm,eps", [("Linf", 0.1), ("L2", 2.0), ("L1", 8.0)])
def test_square_and_apgd_give_the_same_bits_from_nhwc_images(norm, eps):
    model = ChannelsLastInputs(_model().requires_grad_(False))
    x = torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.arange(6) % 3
    runs = []
    for images in (x, x.contiguous(memory_format=torch.channels_last)):
        s = square(model, images, y, norm=norm, eps=eps, n_queries=60, generator=0, early_stop=False)
        a = apgd(model, images, y, norm=norm, eps=eps, n_iter=10, generator=0) if norm != "L1" else None
        runs.append((s.x_adv.contiguous(), s.n_queries_used) + ((a.x_best.contiguous(), a.loss_best) if a else ()))
    for before, after in zip(*runs):
        assert torch.equal(before, after)


@pytest.mark.parametrize("norm,eps", [("L2", 1.0), ("L1", 1.0)])
def test_square_lays_its_candidates_out_as_the_images_given(norm, eps, monkeypatch):
    """Square-L2/L1 sum in NCHW order whatever the images' layout, and make each candidate in the images' layout
    (issue 54: NHWC images give the model NHWC candidates, no copy per query), with the same bits; at 3x32x32 L1
    takes its support path on the CPU."""
    import importlib

    square_module = importlib.import_module("rgb.attacks.square")
    seen, projected = [], []

    def counted(*args):
        projected.append(len(args[0]))
        return project_l1_values(*args)

    monkeypatch.setattr(square_module, "project_l1_values", counted)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3))

        def forward(self, x):
            seen.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
            return self.body(x)

    model = Net().eval().requires_grad_(False)
    x = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    y = model(x).argmax(dim=1)  # all correct at the start
    runs = []
    for images in (x, x.contiguous(memory_format=torch.channels_last)):
        seen.clear()
        result = square(model, images, y, norm=norm, eps=eps, n_queries=700, generator=0, early_stop=False)
        runs.append((result.x_adv.contiguous(), result.n_queries_used, result.fooled))
        assert all(seen) == (images is not x) and any(seen) == (images is not x)
    assert runs[0][2].sum() < len(y) and bool(projected) == (norm == "L1")
    for before, after in zip(*runs):
        assert torch.equal(before, after)
