"""#54.2: attacks given NHWC images (input_format="channels_last" keeps the state NHWC) return the same bits as
given NCHW images, where the model sees NHWC copies either way."""

import pytest
import torch
from torch import nn

from rgb.attacks.apgd import apgd
from rgb.attacks.model_calls import ChannelsLastInputs
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
