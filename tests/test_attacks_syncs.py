"""No attack iteration waits for the device: the host reads of APGD, APGD-T, FAB-T and Square are counted on the
CPU (a TorchFunctionMode that counts every call that forces a device-to-host sync on CUDA) and must not grow
with the number of iterations; on a GPU, `torch.cuda.set_sync_debug_mode("error")` holds over the iterations."""

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from rgb.attacks import apgd, apgd_targeted, common, fab_targeted, square

# Calls that wait for the device on CUDA: a value read on the host, or an output whose size is data-dependent.
SYNCING = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
           torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy,
           torch.Tensor.nonzero, torch.nonzero, torch.Tensor.masked_select, torch.masked_select, torch.unique,
           torch.Tensor.unique}


class SyncCounter(TorchFunctionMode):
    """Counts the calls that would synchronise a CUDA device (boolean-mask indexing included)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING:
            self.count += 1
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _bool_index(args[1]):
            self.count += 1
        return func(*args, **kwargs)


def _bool_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10)).eval()


def _data():
    generator = torch.Generator().manual_seed(1)
    return torch.rand(6, 3, 8, 8, generator=generator), torch.randint(0, 10, (6,), generator=generator)


EPS = {"Linf": 1e-4, "L2": 1e-3, "L1": 1e-2}  # budgets too small to fool anything: every row runs every iteration
ATTACKS = {
    "apgd-ce": lambda model, x, y, norm, steps: apgd(model, x, y, norm=norm, eps=EPS[norm], n_iter=steps,
                                                     generator=0, early_stop=False),
    "apgd-t": lambda model, x, y, norm, steps: apgd_targeted(model, x, y, norm=norm, eps=EPS[norm], n_iter=steps,
                                                             n_targets=2, generator=0, early_stop=False),
    "fab-t": lambda model, x, y, norm, steps: fab_targeted(model, x, y, norm=norm, eps=EPS[norm], n_iter=steps,
                                                           n_targets=2, early_stop=False),
    "square": lambda model, x, y, norm, steps: square(model, x, y, norm=norm, eps=EPS[norm], n_queries=steps,
                                                      generator=0, early_stop=False),
}


def _syncs(attack, norm, steps) -> int:
    model, (x, y) = _model(), _data()
    with SyncCounter() as counter:
        ATTACKS[attack](model, x, y, norm, steps)
    return counter.count


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_iterations_add_no_host_sync(monkeypatch, attack, norm):
    """A fixed budget of host reads per attack call, whatever its iterations (as on a GPU: the CPU's free reads,
    `host_reads_are_free`, switched off)."""
    monkeypatch.setattr(common, "host_reads_are_free", lambda device: False)
    assert _syncs(attack, norm, 3) == _syncs(attack, norm, 12)


def test_the_counter_sees_the_reads_an_iteration_made_before():
    """The CPU's own path (host reads allowed) of FAB-L1 reads in every iteration: the counter must notice."""
    assert _syncs("fab-t", "L1", 3) < _syncs("fab-t", "L1", 12)


@pytest.mark.parametrize("early_stop_every, attack", [(5, "apgd-ce"), (10, "square")])
def test_early_stop_reads_once_every_few_iterations(monkeypatch, early_stop_every, attack):
    monkeypatch.setattr(common, "host_reads_are_free", lambda device: False)
    model, (x, y) = _model(), _data()
    counts = []
    for steps in (10, 40):
        with SyncCounter() as counter:
            if attack == "apgd-ce":
                apgd(model, x, y, norm="Linf", eps=EPS["Linf"], n_iter=steps, generator=0)
            else:
                square(model, x, y, norm="Linf", eps=EPS["Linf"], n_queries=steps, generator=0)
        counts.append(counter.count)
    assert counts[1] - counts[0] <= 2 * 30 // early_stop_every  # LiveRows.keep: nonzero and numel's read


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_no_sync_inside_iterations_on_cuda(attack, norm):
    """From the first iteration's end to the last's, any synchronising CUDA call raises."""
    model, (x, y) = _model().cuda(), _data()
    steps = 6

    def watch(*position):
        torch.cuda.set_sync_debug_mode("error" if position[-2] < position[-1] else 0)

    kwargs = dict(norm=norm, eps=EPS[norm], early_stop=False, progress=watch)
    x, y = x.cuda(), y.cuda()
    try:
        if attack == "apgd-ce":
            apgd(model, x, y, n_iter=steps, generator=0, **kwargs)
        elif attack == "apgd-t":
            apgd_targeted(model, x, y, n_iter=steps, n_targets=2, generator=0, **kwargs)
        elif attack == "fab-t":
            fab_targeted(model, x, y, n_iter=steps, n_targets=2, **kwargs)
        else:
            square(model, x, y, n_queries=steps, generator=0, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
