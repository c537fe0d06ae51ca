"""``fused_duration`` in plain PyTorch: the stochastic duration predictor's dilated depth-separable
convolutions and its coupling layers' rational-quadratic spline, as the kernels compute them.

The spline is the model's own (``duration.ConvFlow`` runs ``spline_coupling`` when its kernel is off),
written with ``torch.where`` instead of boolean indexing so that every shape is static (CUDA-graph
capturable); ``dds_conv`` takes ``FusedDDSConv.layers`` (``tests/test_kernels.py`` holds the kernels to both).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

MIN_BIN_WIDTH = MIN_BIN_HEIGHT = MIN_DERIVATIVE = 1e-3
#: Piper's ``searchsorted`` adds this to the last bin edge.
EDGE_EPS = 1e-6


def knots(unnormalized: torch.Tensor, bound: float, min_size: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Bin edges ``[..., K+1]`` spanning ``[-bound, bound]`` and bin sizes ``[..., K]``."""
    k = unnormalized.shape[-1]
    sizes = min_size + (1 - min_size * k) * torch.softmax(unnormalized, dim=-1)
    inner = 2 * bound * torch.cumsum(sizes, dim=-1)[..., :-1] - bound
    lo = torch.full_like(inner[..., :1], -bound)
    edges = torch.cat([lo, inner, -lo], dim=-1)
    return edges, edges[..., 1:] - edges[..., :-1]


def rational_quadratic_inverse(
    y: torch.Tensor,
    widths_un: torch.Tensor,
    heights_un: torch.Tensor,
    derivatives_un: torch.Tensor,
    tail_bound: float,
) -> torch.Tensor:
    """Inverse of the monotone rational-quadratic spline with linear (identity) tails.

    ``y`` [...]; ``widths_un``, ``heights_un`` [..., K]; ``derivatives_un`` [..., K-1].
    Outside ``[-tail_bound, tail_bound]`` the transform is the identity.
    """
    tail = math.log(math.exp(1 - MIN_DERIVATIVE) - 1)
    derivatives = MIN_DERIVATIVE + F.softplus(F.pad(derivatives_un, (1, 1), value=tail))
    cumw, widths = knots(widths_un, tail_bound, MIN_BIN_WIDTH)
    cumh, heights = knots(heights_un, tail_bound, MIN_BIN_HEIGHT)
    inside = (y >= -tail_bound) & (y <= tail_bound)
    yc = y.clamp(-tail_bound, tail_bound)
    k = widths.shape[-1]
    edges = torch.cat([cumh[..., :-1], cumh[..., -1:] + EDGE_EPS], dim=-1)
    idx = ((yc[..., None] >= edges).sum(dim=-1, keepdim=True) - 1).clamp(0, k - 1)

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-1, idx)[..., 0]

    x0, w, y0, h = pick(cumw), pick(widths), pick(cumh), pick(heights)
    delta = h / w
    d0, d1 = pick(derivatives), derivatives[..., 1:].gather(-1, idx)[..., 0]
    dy = yc - y0
    slope_sum = d0 + d1 - 2 * delta
    a = dy * slope_sum + h * (delta - d0)
    b = h * d0 - dy * slope_sum
    c = -delta * dy
    discriminant = (b * b - 4 * a * c).clamp_min(0)
    theta = (2 * c) / (-b - torch.sqrt(discriminant))
    return torch.where(inside, theta * w + x0, y)


def spline_coupling(x: torch.Tensor, h: torch.Tensor, mask: torch.Tensor, num_bins: int, filter_channels: int,
                    tail_bound: float) -> torch.Tensor:  # fmt: skip
    """A coupling layer's output for ``x`` [B, 2c, T] and its unmasked projection ``h`` [B, c (3K - 1), T]
    (``num_bins`` K): ``cat(x0, spline^-1(x1)) * mask``, the spline's knots from ``h`` masked."""
    x0, x1 = torch.split(x, [x.shape[1] // 2] * 2, 1)
    b, c, t = x0.shape
    h = (h * mask).reshape(b, c, -1, t).permute(0, 1, 3, 2)  # [B, c, T, 3K-1]
    k, scale = num_bins, math.sqrt(filter_channels)
    x1 = rational_quadratic_inverse(x1, h[..., :k] / scale, h[..., k : 2 * k] / scale, h[..., 2 * k :], tail_bound)
    return torch.cat([x0, x1], 1) * mask


def _channel_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x.transpose(1, 2), (x.shape[1],), gamma, beta, eps).transpose(1, 2)


def dds_conv(x: torch.Tensor, mask: torch.Tensor, layers: list[tuple]) -> torch.Tensor:
    """``DDSConv.forward`` from ``FusedDDSConv.layers`` (per layer: depthwise weight [C, K], bias, K,
    dilation, LayerNorm gamma, beta, eps, pointwise weight [C, C], bias, LayerNorm gamma, beta, eps)."""
    for w_sep, b_sep, kernel, dilation, g1, be1, eps1, w_1x1, b_1x1, g2, be2, eps2 in layers:
        channels = x.shape[1]
        y = F.conv1d(x * mask, w_sep.view(channels, 1, kernel), b_sep, dilation=dilation, groups=channels,
                     padding=(kernel - 1) * dilation // 2)  # fmt: skip
        y = F.gelu(_channel_norm(y, g1, be1, eps1))
        y = F.gelu(_channel_norm(torch.matmul(w_1x1, y) + b_1x1.view(1, -1, 1), g2, be2, eps2))
        x = x + y
    return x * mask
