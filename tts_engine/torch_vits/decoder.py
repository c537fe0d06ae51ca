"""HiFi-GAN generator (VITS ``dec``): latent frames -> float32 waveform in [-1, 1].

``forward(z, mask)``: ``z`` [B, C, F] frames, ``mask`` [B, 1, F] or None. With a mask,
the input of every convolution is zeroed outside the valid samples at its rate, which
makes a masked window compute, inside its valid part, exactly what Piper computes on
the unpadded utterance (whose convolutions see zero padding at the edges). Without a
mask it is Piper's generator as exported to ONNX. Output is [B, F * hop_length] samples.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

LRELU_SLOPE = 0.1
#: ``F.leaky_relu``'s default, which Piper's generator applies before ``conv_post``.
POST_SLOPE = 0.01


class ResBlock1(nn.Module):
    """Pairs of (dilated, plain) convolutions with residual connections (Piper "high" voices)."""

    def __init__(self, channels: int, kernel_size: int, dilation: tuple[int, ...]) -> None:
        super().__init__()
        pad = [(kernel_size - 1) * d // 2 for d in dilation]
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=p) for d, p in zip(dilation, pad)
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in dilation
        )
        self.radius = sum(pad) + len(dilation) * (kernel_size - 1) // 2

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            xt = _masked(F.leaky_relu(x, LRELU_SLOPE), mask)
            xt = _masked(F.leaky_relu(c1(xt), LRELU_SLOPE), mask)
            x = c2(xt) + x
        return x


class ResBlock2(nn.Module):
    """Dilated convolutions with residual connections (Piper "medium"/"low" voices)."""

    def __init__(self, channels: int, kernel_size: int, dilation: tuple[int, ...]) -> None:
        super().__init__()
        pad = [(kernel_size - 1) * d // 2 for d in dilation]
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=p) for d, p in zip(dilation, pad)
        )
        self.radius = sum(pad)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for conv in self.convs:
            x = conv(_masked(F.leaky_relu(x, LRELU_SLOPE), mask)) + x
        return x


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


class PolyphaseUp:
    """A ``ConvTranspose1d`` whose kernel is a multiple of its stride ``s``, as a plain convolution
    to ``s x C_out`` channels (one set per output phase) whose outputs are interleaved: the same
    sums in another order, as a forward convolution (cuDNN's transposed ones are slow for these
    shapes). Holds its own copy of the weights (take it after the last dtype or device change)."""

    def __init__(self, up: nn.ConvTranspose1d) -> None:
        self.stride, kernel, self.padding = up.stride[0], up.kernel_size[0], up.padding[0]
        if not self.supports(up):
            raise ValueError(f"no polyphase form for {up}")
        self.taps = kernel // self.stride
        c_in, self.c_out, _ = up.weight.shape
        w = up.weight.detach().view(c_in, self.c_out, self.taps, self.stride).flip(2)  # [.., tap j, phase r]
        self.weight = w.permute(3, 1, 0, 2).reshape(self.stride * self.c_out, c_in, self.taps).contiguous()
        self.bias = None if up.bias is None else up.bias.detach().repeat(self.stride)
        self.kernel = kernel

    @staticmethod
    def supports(up: nn.Module) -> bool:
        if not isinstance(up, nn.ConvTranspose1d):
            return False
        return up.kernel_size[0] % up.stride[0] == 0 and up.groups == 1 and up.dilation[0] == 1 and not up.output_padding[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b, _, n = x.shape
        y = F.conv1d(x, self.weight, self.bias, padding=self.taps - 1)  # [B, s * C_out, n + taps - 1]
        y = y.view(b, self.stride, self.c_out, n + self.taps - 1).permute(0, 2, 3, 1).reshape(b, self.c_out, -1)
        return y[:, :, self.padding : self.padding + (n - 1) * self.stride - 2 * self.padding + self.kernel]


class Generator(nn.Module):
    """Upsampling transposed convolutions, each followed by the mean of parallel ResBlocks."""

    def __init__(
        self,
        initial_channel: int,
        resblock: str,
        resblock_kernel_sizes: tuple[int, ...],
        resblock_dilation_sizes: tuple[tuple[int, ...], ...],
        upsample_rates: tuple[int, ...],
        upsample_initial_channel: int,
        upsample_kernel_sizes: tuple[int, ...],
        gin_channels: int = 0,
    ) -> None:
        super().__init__()
        self.num_kernels = len(resblock_kernel_sizes)
        self.upsample_rates = tuple(upsample_rates)
        self.conv_pre = nn.Conv1d(initial_channel, upsample_initial_channel, 7, 1, padding=3)
        block = ResBlock1 if resblock == "1" else ResBlock2
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = upsample_initial_channel
        for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes)):
            ch = upsample_initial_channel // (2 ** (i + 1))
            self.ups.append(nn.ConvTranspose1d(ch * 2, ch, k, u, padding=(k - u) // 2))
            for rk, rd in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(block(ch, rk, tuple(rd)))
        self.conv_post = nn.Conv1d(ch, 1, 7, 1, padding=3, bias=False)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, upsample_initial_channel, 1)
        #: Per stage, its blocks as fused Triton kernels (``use_fused_blocks``); None: PyTorch's convolutions.
        self.fused: list | None = None
        #: Per stage, its upsampling as ``PolyphaseUp`` (``use_polyphase``); None: ``ConvTranspose1d``.
        self.polyphase: list | None = None
        #: ``(conv_pre, [upsampling per stage], conv_post)`` as fused Triton kernels (``use_fused_upsampling``).
        self.fused_convs: tuple | None = None

    def use_polyphase(self, on: bool = True) -> None:
        """Upsample with ``PolyphaseUp`` (where every stage has a kernel that is a multiple of its stride)."""
        self.polyphase = [PolyphaseUp(up) for up in self.ups] if on and all(map(PolyphaseUp.supports, self.ups)) else None

    def use_fused_blocks(self, on: bool = True) -> None:
        """Run the residual blocks as fused Triton kernels (``fused_resblock``; call after the last dtype or
        device change: the kernels hold their own copy of the weights). A stage whose channel count the
        kernel does not take keeps PyTorch's convolutions (its entry is None)."""
        if not on:
            self.fused = None
            return
        from tts_engine.torch_vits.kernels import fused_resblock

        self.fused = []
        for i, up in enumerate(self.ups):
            blocks = list(self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels])
            ok = fused_resblock.supports(up.out_channels)
            self.fused.append(fused_resblock.FusedStage(blocks, LRELU_SLOPE) if ok else None)

    def use_fused_upsampling(self, on: bool = True) -> bool:
        """Run ``conv_pre``, the upsampling layers (with the leaky ReLU and mask before each) and
        ``conv_post`` + tanh as fused Triton kernels (``fused_upsample``; call after the last dtype or
        device change). Returns whether they are on: a decoder with a layer the kernels do not take
        keeps PyTorch's for all of them. Speaker conditioning (``cond``) stays a PyTorch add after ``conv_pre``."""
        if not on:
            self.fused_convs = None
            return False
        from tts_engine.torch_vits.kernels.fused_upsample import FusedOut, FusedRows

        ups_ok = all(PolyphaseUp.supports(up) and FusedRows.takes_inputs(up.in_channels) for up in self.ups)
        if not (ups_ok and FusedRows.supports(self.conv_pre) and FusedOut.supports(self.conv_post)):
            self.fused_convs = None
            return False
        ups = [FusedRows.from_polyphase(PolyphaseUp(up), LRELU_SLOPE) for up in self.ups]
        self.fused_convs = (FusedRows.from_conv(self.conv_pre), ups, FusedOut(self.conv_post, POST_SLOPE))
        return True

    @property
    def hop_length(self) -> int:
        """Output samples per input frame."""
        return math.prod(self.upsample_rates)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None, g: torch.Tensor | None = None) -> torch.Tensor:
        """``z`` [B, C, F] -> audio [B, F * hop_length] float in [-1, 1]."""
        fused = self.fused_convs
        x = fused[0](z, mask) if fused else self.conv_pre(_masked(z, mask))
        if g is not None:
            x = x + self.cond(g)
        for i, up in enumerate(self.ups):
            if fused:
                x = fused[1][i](x, mask)
            else:
                x = (self.polyphase[i] if self.polyphase else up)(_masked(F.leaky_relu(x, LRELU_SLOPE), mask))
            if mask is not None:
                mask = mask.repeat_interleave(self.upsample_rates[i], dim=2)
            if self.fused is not None and self.fused[i] is not None:
                x = self.fused[i](x, mask)
                continue
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            xs = blocks[0](x, mask)
            for block in blocks[1:]:
                xs = xs + block(x, mask)
            x = xs / self.num_kernels
        if fused:
            return fused[2](x, mask)
        x = self.conv_post(_masked(F.leaky_relu(x, POST_SLOPE), mask))
        return torch.tanh(x)[:, 0]

    @property
    def receptive_radius(self) -> int:
        """Input frames on each side that the samples of one frame depend on."""
        lo, hi = 0, self.hop_length - 1  # samples of frame 0 at the output rate
        lo, hi = lo - 3, hi + 3  # conv_post
        for i in reversed(range(len(self.ups))):
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            r = max(b.radius for b in blocks)
            lo, hi = lo - r, hi + r
            up = self.ups[i]
            k, s, p = up.kernel_size[0], up.stride[0], up.padding[0]
            lo, hi = -((-(lo + p - k + 1)) // s), (hi + p) // s
        return max(-(lo - 3), hi + 3)  # conv_pre
