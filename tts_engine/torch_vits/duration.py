"""VITS stochastic duration predictor, inference direction only.

Noise ``[B, 2, T]`` goes backwards through spline coupling flows conditioned on the
text encoder's states; channel 0 of the result is ``log(duration in frames)``.
The spline is written with ``torch.where`` instead of boolean indexing so that every
shape is static (CUDA-graph capturable). Names follow Piper's training code; the
posterior flows used only in training are not built.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from tts_engine.torch_vits.kernels.fused_duration_ref import spline_coupling
from tts_engine.torch_vits.text_encoder import ChannelLayerNorm

class DDSConv(nn.Module):
    """Dilated depth-separable convolutions (dilation ``kernel_size ** i``) with residuals."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            padding = (kernel_size * dilation - dilation) // 2
            self.convs_sep.append(
                nn.Conv1d(channels, channels, kernel_size, groups=channels, dilation=dilation, padding=padding)
            )
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(ChannelLayerNorm(channels))
            self.norms_2.append(ChannelLayerNorm(channels))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        if g is not None:
            x = x + g
        for sep, pointwise, norm_1, norm_2 in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2):
            y = F.gelu(norm_1(sep(x * mask)))
            y = F.gelu(norm_2(pointwise(y)))
            x = x + y
        return x * mask


class ConvFlow(nn.Module):
    """Coupling layer: the second channel goes through a spline whose knots depend on the first."""

    def __init__(
        self, in_channels: int, filter_channels: int, kernel_size: int, n_layers: int, num_bins: int, tail_bound: float
    ) -> None:
        super().__init__()
        self.filter_channels = filter_channels
        self.num_bins = num_bins
        self.tail_bound = tail_bound
        self.half_channels = in_channels // 2
        self.pre = nn.Conv1d(self.half_channels, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        self.proj = nn.Conv1d(filter_channels, self.half_channels * (num_bins * 3 - 1), 1)
        #: ``fused_duration.spline_coupling`` once ``use_fused_duration_predictor`` turned it on:
        #: (flow, x, unmasked projection, mask) -> the layer's output.
        self.fused_spline: Callable[..., torch.Tensor] | None = None

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half_channels] * 2, 1)
        h = self.proj(self.convs(self.pre(x0), mask, g=g))
        if self.fused_spline is not None:  # the rest in one Triton kernel (fused_duration.py)
            return self.fused_spline(self, x, h, mask)
        return spline_coupling(x, h, mask, self.num_bins, self.filter_channels, self.tail_bound)


class ElementwiseAffine(nn.Module):
    """``y = m + exp(logs) * x`` per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return (x - self.m) * torch.exp(-self.logs) * mask


class Flip(nn.Module):
    """Swap the channel order (no parameters; keeps Piper's module indices)."""

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return torch.flip(x, [1])


class TrainingOnlyFlow(nn.Module):
    """Placeholder for the first spline flow, which Piper drops at inference ("useless vflow")."""


class StochasticDurationPredictor(nn.Module):
    """Text states -> log durations, in frames, from noise (scaled by ``noise_w`` upstream)."""

    def __init__(
        self,
        in_channels: int,
        filter_channels: int,
        kernel_size: int,
        n_flows: int = 4,
        gin_channels: int = 0,
        num_bins: int = 10,
        tail_bound: float = 5.0,
    ) -> None:
        super().__init__()
        flows: list[nn.Module] = [ElementwiseAffine(2)]
        for i in range(n_flows):
            if i == 0:
                flows.append(TrainingOnlyFlow())
            else:
                flows.append(ConvFlow(2, filter_channels, kernel_size, 3, num_bins, tail_bound))
            flows.append(Flip())
        self.flows = nn.ModuleList(flows)
        self.pre = nn.Conv1d(in_channels, filter_channels, 1)
        self.proj = nn.Conv1d(filter_channels, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, 3)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, filter_channels, 1)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` [B, H, T] encoder states, ``noise`` [B, 2, T] -> ``log w`` [B, 1, T]."""
        x = self.pre(x)
        if g is not None:
            x = x + self.cond(g)
        x = self.proj(self.convs(x, mask)) * mask
        z = noise
        # Piper's order: all flows reversed, without the first spline flow (index 1).
        for flow in reversed(self.flows):
            if not isinstance(flow, TrainingOnlyFlow):
                z = flow.reverse(z, mask, g=x)
        return z[:, :1]
