"""Projections onto the Lp-ball around x intersected with the [0,1] box (per sample, on device, no host syncs)."""

from __future__ import annotations

import math

import torch

from rgb.attacks.common import per_sample


def project_linf(x: torch.Tensor, x_adv: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Clip x_adv to [x - eps, x + eps], then to [0, 1] (this order is the exact projection for Linf)."""
    eps = per_sample(eps, x)
    return torch.minimum(torch.maximum(x_adv, x - eps), x + eps).clamp(0.0, 1.0)


def project_l2(x: torch.Tensor, x_adv: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Rescale x_adv - x onto the L2 ball of radius eps if outside it, then clip to [0, 1] (AutoAttack's order)."""
    eps = per_sample(eps, x)
    delta = x_adv - x
    norm = delta.flatten(1).norm(p=2, dim=1).view_as(eps)
    delta = torch.where(norm > eps, delta * (eps / norm.clamp_min(1e-12)), delta)
    return (x + delta).clamp(0.0, 1.0)


def _l1_mass(magnitude: torch.Tensor, room: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """sum_i clamp(|delta_i| - lam, 0, room_i): the L1 norm of the projection for threshold lam, per row."""
    return torch.minimum((magnitude - lam).clamp_min(0.0), room).sum(dim=1)


def project_l1_ball_box(x: torch.Tensor, delta: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Exact Euclidean projection of delta onto {v : ||v||_1 <= eps, 0 <= x + v <= 1}, per sample.

    With a_i = |delta_i| and c_i = min(a_i, distance from x_i to the box face delta_i points at), the solution
    is v_i = sign(delta_i) * clamp(a_i - lam, 0, c_i) with lam = 0 if sum(c) <= eps, else the root of the
    piecewise-linear, non-increasing mass S(lam) = eps. The root lies between two consecutive breakpoints
    {a_i - c_i} u {a_i}; we bisect over the sorted breakpoints (fixed step count, no host sync) and
    interpolate linearly on the final segment, where S is exactly linear. Assumes x in [0, 1].
    """
    if x.shape != delta.shape:
        raise ValueError(f"x and delta must have the same shape, got {tuple(x.shape)} and {tuple(delta.shape)}")
    n = x.shape[0]
    eps_col = per_sample(eps, x).view(n)
    x_flat, delta_flat = x.flatten(1), delta.flatten(1)
    magnitude = delta_flat.abs()
    room = torch.minimum(magnitude, torch.where(delta_flat > 0, 1.0 - x_flat, x_flat)).clamp_min(0.0)

    breakpoints, _ = torch.sort(torch.cat([magnitude - room, magnitude], dim=1), dim=1)
    n_points = breakpoints.shape[1]
    # Invariant: S(breakpoints[lo]) >= eps > S(breakpoints[hi]) for rows that need shrinking
    # (S(smallest breakpoint) = sum(room), S(largest breakpoint) = 0).
    lo = torch.zeros(n, 1, dtype=torch.long, device=x.device)
    hi = torch.full_like(lo, n_points - 1)
    for _ in range(max(math.ceil(math.log2(n_points)), 1)):
        mid = (lo + hi) // 2
        mass_mid = _l1_mass(magnitude, room, breakpoints.gather(1, mid))
        keep_low = mass_mid >= eps_col
        lo = torch.where(keep_low[:, None], mid, lo)
        hi = torch.where(keep_low[:, None], hi, mid)
    lam_lo, lam_hi = breakpoints.gather(1, lo), breakpoints.gather(1, hi)
    mass_lo = _l1_mass(magnitude, room, lam_lo)[:, None]
    mass_hi = _l1_mass(magnitude, room, lam_hi)[:, None]
    drop = mass_lo - mass_hi
    lam = torch.where(
        drop > 0, lam_lo + (mass_lo - eps_col[:, None]) * (lam_hi - lam_lo) / drop.clamp_min(1e-30), lam_hi
    )
    lam = torch.where(room.sum(dim=1, keepdim=True) > eps_col[:, None], lam.clamp_min(0.0), torch.zeros_like(lam))
    projected = torch.minimum((magnitude - lam).clamp_min(0.0), room)
    return (torch.sign(delta_flat) * projected).view_as(delta)
