"""VITS normalizing flow (prior -> posterior latent), inference direction only.

Every convolution's input is multiplied by the frame ``mask`` first, so a window of
frames whose out-of-utterance part is masked gives, inside the utterance, exactly
what the whole utterance gives (zero padding == masked frames). ``receptive_radius``
says how many frames of context a window needs for that.
Weight norm is folded into plain weights (as in Piper's ONNX export).
"""

from __future__ import annotations

import torch
from torch import nn


class WaveNet(nn.Module):
    """Gated dilated convolutions (``WN`` in Piper), non-causal."""

    def __init__(
        self, hidden_channels: int, kernel_size: int, dilation_rate: int, n_layers: int, gin_channels: int = 0
    ) -> None:
        super().__init__()
        self.hidden_channels = hidden_channels
        self.n_layers = n_layers
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        if gin_channels:
            self.cond_layer = nn.Conv1d(gin_channels, 2 * hidden_channels * n_layers, 1)
        for i in range(n_layers):
            dilation = dilation_rate**i
            padding = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(
                nn.Conv1d(hidden_channels, 2 * hidden_channels, kernel_size, dilation=dilation, padding=padding)
            )
            out = 2 * hidden_channels if i < n_layers - 1 else hidden_channels
            self.res_skip_layers.append(nn.Conv1d(hidden_channels, out, 1))
        #: The layers as fused Triton kernels (``fused_flow.use_fused_flow``); None: PyTorch's.
        self.fused = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [B, H, T] (already masked) -> skip sum [B, H, T], masked."""
        if self.fused is not None and g is None:
            return self.fused(x, mask)
        hc = self.hidden_channels
        cond = self.cond_layer(g) if g is not None else None
        output = torch.zeros_like(x)
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            x_in = in_layer(x)
            if cond is not None:
                x_in = x_in + cond[:, 2 * hc * i : 2 * hc * (i + 1)]
            acts = torch.tanh(x_in[:, :hc]) * torch.sigmoid(x_in[:, hc:])
            rs = res_skip(acts)
            if i < self.n_layers - 1:
                x = (x + rs[:, :hc]) * mask
                output = output + rs[:, hc:]
            else:
                output = output + rs
        return output * mask


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half is shifted by a function of the first."""

    def __init__(
        self,
        channels: int,
        hidden_channels: int,
        kernel_size: int,
        dilation_rate: int,
        n_layers: int,
        gin_channels: int = 0,
    ) -> None:
        super().__init__()
        self.half_channels = channels // 2
        self.pre = nn.Conv1d(self.half_channels, hidden_channels, 1)
        self.enc = WaveNet(hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels)
        self.post = nn.Conv1d(hidden_channels, self.half_channels, 1)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half_channels] * 2, 1)
        h = self.enc(self.pre(x0) * mask, mask, g=g)
        shift = self.post(h) * mask
        return torch.cat([x0, (x1 - shift) * mask], 1)


class ChannelFlip(nn.Module):
    """Reverse the channel order (no parameters; keeps Piper's module indices)."""

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return torch.flip(x, [1])


class ResidualCouplingBlock(nn.Module):
    """``n_flows`` coupling layers, each followed by a channel flip."""

    def __init__(
        self,
        channels: int,
        hidden_channels: int,
        kernel_size: int,
        dilation_rate: int,
        n_layers: int,
        n_flows: int = 4,
        gin_channels: int = 0,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.dilation_rate = dilation_rate
        self.n_layers = n_layers
        flows: list[nn.Module] = []
        for _ in range(n_flows):
            flows.append(
                ResidualCouplingLayer(channels, hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels)
            )
            flows.append(ChannelFlip())
        self.flows = nn.ModuleList(flows)

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """Prior sample ``z`` [B, C, F] -> decoder input [B, C, F]; ``mask`` [B, 1, F]."""
        for flow in reversed(self.flows):
            z = flow.reverse(z, mask, g=g)
        return z

    @property
    def conv_radius(self) -> int:
        """Frames on each side that one convolution reads: masked frames enough to keep two
        utterances laid end to end apart (every convolution's input is masked)."""
        return (self.kernel_size - 1) // 2 * self.dilation_rate ** (self.n_layers - 1)

    @property
    def receptive_radius(self) -> int:
        """Frames on each side that one output frame depends on."""
        per_layer = sum((self.kernel_size - 1) // 2 * self.dilation_rate**i for i in range(self.n_layers))
        n_couplings = sum(isinstance(f, ResidualCouplingLayer) for f in self.flows)
        return n_couplings * per_layer
