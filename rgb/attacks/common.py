"""Helpers shared by every attack: norm names, per-sample norms, eps broadcasting, RNG, eval counting."""

from __future__ import annotations

from dataclasses import dataclass

import torch

NORMS = ("Linf", "L2", "L1")


def parse_norm(norm: str) -> str:
    """Canonical norm name ("Linf", "L2" or "L1") from any capitalisation."""
    if isinstance(norm, str):
        for name in NORMS:
            if norm.lower() == name.lower():
                return name
    raise ValueError(f"norm must be one of {NORMS} (any case), got {norm!r}")


def lp_norm(delta: torch.Tensor, norm: str) -> torch.Tensor:
    """Per-sample norm of `delta` (leading batch dim, any trailing shape) -> shape (N,)."""
    flat = delta.flatten(1)
    norm = parse_norm(norm)
    if norm == "Linf":
        return flat.abs().amax(dim=1)
    if norm == "L2":
        return flat.norm(p=2, dim=1)
    return flat.abs().sum(dim=1)


def per_sample(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`value` (a float or a (N,) tensor) as a tensor that broadcasts against `like` sample by sample."""
    value = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if value.dim() == 0:
        value = value.expand(like.shape[0])
    if value.shape != (like.shape[0],):
        raise ValueError(f"expected a scalar or a ({like.shape[0]},) tensor, got shape {tuple(value.shape)}")
    return as_column(value, like)


def as_column(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """View per-sample `values` (N,) as (N, 1, ..., 1) to broadcast against `like`."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def check_eps(eps: float | torch.Tensor) -> None:
    """Reject negative budgets (a host sync, so call it once per attack, not per step)."""
    if bool((torch.as_tensor(eps) < 0).any()):
        raise ValueError(f"eps must be >= 0, got {eps}")


def make_generator(generator: torch.Generator | int | None, device: torch.device) -> torch.Generator | None:
    """A generator on `device`: pass one through, seed a fresh one from an int, or None for the global RNG."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    seeded = torch.Generator(device=device)
    seeded.manual_seed(int(generator))
    return seeded


@dataclass
class EvalCounter:
    """Model evaluations spent by attacks, in rows (one row = one image through the model).

    Attacks call `forward(n)` for every forward pass over n rows and `backward(n)` for every
    backward pass, so a caller can report the cost per attacked image.
    """

    forward_rows: int = 0
    backward_rows: int = 0

    def forward(self, n_rows: int) -> None:
        self.forward_rows += int(n_rows)

    def backward(self, n_rows: int) -> None:
        self.backward_rows += int(n_rows)

    def per_image(self, n_images: int) -> dict[str, float]:
        """Forward and backward rows per attacked image."""
        if n_images <= 0:
            raise ValueError(f"n_images must be positive, got {n_images}")
        return {"forward": self.forward_rows / n_images, "backward": self.backward_rows / n_images}
