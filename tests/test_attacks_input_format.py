"""input_format="auto" (issue 54 item 4): on the CPU a convnet's attacks get the memory format a timed step at the
batch's size prefers, and the result says which and why; anything else gets the images as given, said so."""

import torch
from torch import nn

from rgb.attacks.autoattack import AutoAttack


def small_convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(32, 10)).eval()


def test_auto_times_both_formats_at_the_batch_size_and_records_the_choice():
    model = small_convnet()
    x = torch.rand(40, 3, 16, 16)
    y = model(x).argmax(1)
    result = AutoAttack(model, "Linf", 0.01, attacks=["apgd-ce"], steps=2, capture="eager").run(x, y, batch_size=32)
    assert result.input_format in ("channels_last", "contiguous")
    assert result.input_format_reason.startswith("auto: per forward + input gradient of 32 rows channels_last ")
    assert " vs contiguous " in result.input_format_reason
    # the timing passes (once per process) are not charged to the images: rows never depend on which worker ran
    assert result.evaluations["clean"] == {"forward_rows": len(x) + 1, "backward_rows": 0}
    small = AutoAttack(model, "Linf", 0.01, attacks=["apgd-ce"], steps=2).run(x[:8], y[:8])
    assert (small.input_format, small.input_format_reason) == (
        "channels_last", "auto: NHWC, untimed below 32 rows (where it wins on the CPU)")


def test_the_format_asked_for_or_a_model_without_convolutions_is_recorded_with_its_reason(toy):
    mlp, x, y = toy
    result = AutoAttack(mlp, "Linf", 0.01, attacks=["apgd-ce"], steps=2).run(x[:4], y[:4])
    assert (result.input_format, result.input_format_reason) == (
        "contiguous", "auto: NHWC is only tried for a model with 2-d convolutions on the CPU")
    model = small_convnet()
    x = torch.rand(4, 3, 16, 16)
    asked = AutoAttack(model, "Linf", 0.01, attacks=["apgd-ce"], steps=2, input_format="channels_last").run(
        x, model(x).argmax(1))
    assert (asked.input_format, asked.input_format_reason) == ("channels_last", "as asked")
