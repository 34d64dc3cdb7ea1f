"""batch_size=auto: the probe's doubling search, its cache per model and device, and the CPU's fixed answer."""

import time

import pytest
import torch
from torch import nn

from helpers import compose_config
from rgb.runs import batch_probe


class FitsUpTo(nn.Module):
    """A model that runs out of memory above `limit` rows, as a GPU would."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.linear, self.seen = limit, nn.Linear(12, 5), []

    def forward(self, x):
        self.seen.append(len(x))
        if len(x) > self.limit:
            raise torch.OutOfMemoryError("probe")
        return self.linear(x.flatten(1))


def test_probe_doubles_until_memory_runs_out_and_keeps_a_safety_share():
    model = FitsUpTo(300)
    assert batch_probe.largest_batch(model, (3, 2, 2), torch.device("cpu")) == int(256 * batch_probe.SAFETY)
    assert model.seen == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def test_probe_stops_at_the_ceiling_and_refuses_when_nothing_fits():
    assert batch_probe.largest_batch(FitsUpTo(10**6), (12,), torch.device("cpu"), ceiling=64) == 64
    with pytest.raises(torch.OutOfMemoryError, match="not even one image"):
        batch_probe.largest_batch(FitsUpTo(0), (12,), torch.device("cpu"))


def test_auto_is_cached_per_model_and_device(tmp_path, monkeypatch):
    cache = tmp_path / "batch_sizes.json"
    monkeypatch.setattr(batch_probe, "device_key", lambda device: "cuda:H200:1")
    device = torch.device("meta")  # any non-CPU device: the probe itself is replaced below
    probes = []
    monkeypatch.setattr(batch_probe, "largest_batch", lambda *args: probes.append(args) or 96)
    first = batch_probe.auto_batch_size(FitsUpTo(1), "sha-a", (3, 8, 8), device, cache)
    again = batch_probe.auto_batch_size(FitsUpTo(1), "sha-a", (3, 8, 8), device, cache)
    other = batch_probe.auto_batch_size(FitsUpTo(1), "sha-b", (3, 8, 8), device, cache)
    assert (first["source"], again["source"], other["source"]) == ("probe", "cache", "probe")
    assert first["batch_size"] == again["batch_size"] == 96 and len(probes) == 2


def test_auto_on_the_cpu_is_a_fixed_size(tmp_path):
    answer = batch_probe.auto_batch_size(FitsUpTo(1), "sha", (12,), torch.device("cpu"), tmp_path / "c.json")
    assert answer == {"batch_size": batch_probe.CPU_BATCH, "source": "cpu default", "device": "cpu"}
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("cuda, expected", [(False, 50), (True, "auto")])
def test_attack_config_batch_size_is_auto_on_cuda_only(monkeypatch, cuda, expected):
    """The CPU's runs keep the data config's batch size (and so their identities); CUDA's default is auto."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert compose_config("attack", "run=x").batch_size == expected


class CostsPerCall(nn.Module):
    """A model whose step costs `overhead` CPU seconds per call plus `per_row` per row (it spins on the clock)."""

    def __init__(self, overhead: float, per_row: float):
        super().__init__()
        self.overhead, self.per_row, self.linear = overhead, per_row, nn.Linear(12, 5)

    def forward(self, x):
        until = time.process_time() + self.overhead + self.per_row * len(x)
        while time.process_time() < until:
            pass
        return self.linear(x.flatten(1))


def test_saturation_is_the_fewest_rows_within_the_share_of_the_cheapest_per_row():
    """7 units per call + 1 per row: per row 1.11 at 64 rows (the cheapest), 1.22 at 32 (within 1.15x), 1.44 at 16."""
    unit = 2e-4
    found = batch_probe.saturation_rows(CostsPerCall(7 * unit, unit), torch.rand(5, 3, 2, 2), 64)
    assert found["rows"] == 32 and list(found["seconds_per_row"]) == ["1", "2", "4", "8", "16", "32", "64"]
    capped = batch_probe.saturation_rows(CostsPerCall(0, 0), torch.rand(5, 3, 2, 2), 24)  # no larger than a batch
    assert list(capped["seconds_per_row"]) == ["1", "2", "4", "8", "16", "24"] and capped["rows"] <= 24
