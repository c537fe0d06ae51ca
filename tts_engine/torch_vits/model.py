"""The one VITS model definition (Piper's ``SynthesizerTrn``, inference only), in PyTorch.

``Vits`` is split in the stages the GPU engine schedules separately:

- ``encode``: ids -> text states, prior mean/log-std per phoneme;
- ``durations``: stochastic duration predictor -> frames per phoneme (ceil'd);
- ``expand_prior``: per-phoneme prior -> per-frame prior sample ``z_p``;
- ``flow.reverse`` + ``dec``: ``z_p`` -> waveform (run whole, or in chunks: ``chunked.py``).

``infer`` chains them for whole utterances. Units: ids and phoneme axes in symbols,
frame axes in latent frames (``hop_length`` samples each), audio in float32 samples at
the voice's rate. Weights: ``weights.py`` (from a Piper ``.onnx`` or a checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tts_engine.torch_vits.decoder import Generator
from tts_engine.torch_vits.kernels import fused_prior_ref
from tts_engine.torch_vits.duration import StochasticDurationPredictor
from tts_engine.torch_vits.flow import ResidualCouplingBlock
from tts_engine.torch_vits.text_encoder import TextEncoder


@dataclass(frozen=True)
class VitsConfig:
    """Hyper-parameters of a Piper VITS voice (defaults: Piper "medium")."""

    #: Symbols in the phoneme id table.
    n_vocab: int = 256
    #: Latent (prior/posterior) channels.
    inter_channels: int = 192
    #: Text encoder / flow hidden channels.
    hidden_channels: int = 192
    #: Text encoder feed-forward channels.
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    #: Text encoder feed-forward kernel.
    kernel_size: int = 3
    #: Relative attention window, symbols each side.
    window_size: int = 4
    #: HiFi-GAN residual block type: "1" or "2".
    resblock: str = "2"
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_initial_channel: int = 256
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    n_speakers: int = 1
    #: Speaker embedding channels (0 for single-speaker voices).
    gin_channels: int = 0
    #: Coupling layers in the flow, WaveNet layers in each, and their kernel / dilation rate.
    flow_n_flows: int = 4
    flow_n_layers: int = 4
    flow_kernel_size: int = 5
    flow_dilation_rate: int = 1
    #: Stochastic duration predictor channels and kernel.
    dp_filter_channels: int = 192
    dp_kernel_size: int = 3
    dp_n_flows: int = 4

    @property
    def hop_length(self) -> int:
        """Audio samples per latent frame."""
        return math.prod(self.upsample_rates)


def pad_ids(sequences: Sequence[Sequence[int]], length: int | None = None,
            device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Phoneme-id sequences as one zero-padded batch: ``ids`` [B, length or the longest] int64 and
    ``lengths`` [B] int64, on ``device`` (what ``Vits.encode`` and ``infer`` take)."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    ids = torch.zeros(len(sequences), length or int(lengths.max()), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return ids.to(device), lengths.to(device)


class Vits(nn.Module):
    """Piper VITS for inference; parameter names equal Piper's (weight norm folded)."""

    def __init__(self, config: VitsConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.enc_p = TextEncoder(
            c.n_vocab, c.inter_channels, c.hidden_channels, c.filter_channels, c.n_heads, c.n_layers,
            c.kernel_size, c.window_size,
        )  # fmt: skip
        self.dp = StochasticDurationPredictor(
            c.hidden_channels, c.dp_filter_channels, c.dp_kernel_size, c.dp_n_flows, c.gin_channels
        )
        self.flow = ResidualCouplingBlock(
            c.inter_channels, c.hidden_channels, c.flow_kernel_size, c.flow_dilation_rate, c.flow_n_layers,
            c.flow_n_flows, c.gin_channels,
        )  # fmt: skip
        self.dec = Generator(
            c.inter_channels, c.resblock, c.resblock_kernel_sizes, c.resblock_dilation_sizes, c.upsample_rates,
            c.upsample_initial_channel, c.upsample_kernel_sizes, c.gin_channels,
        )  # fmt: skip
        if c.n_speakers > 1:
            self.emb_g = nn.Embedding(c.n_speakers, c.gin_channels)

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    def speaker_embedding(self, sid: torch.Tensor | None) -> torch.Tensor | None:
        """``sid`` [B] -> ``g`` [B, gin, 1], or None for a single-speaker voice."""
        if self.config.n_speakers <= 1:
            return None
        if sid is None:
            raise ValueError("multi-speaker voice: a speaker id is required")
        return self.emb_g(sid).unsqueeze(-1)

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``ids`` [B, T] int64, ``lengths`` [B] -> ``x`` [B, H, T], ``m_p``, ``logs_p`` [B, C, T], ``mask`` [B, 1, T]."""
        return self.enc_p(ids, lengths)

    def durations(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        noise_w: torch.Tensor,
        length_scale: torch.Tensor,
        g: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames per phoneme ``w_ceil`` [B, T] (float, integral) and utterance frames [B] int64.

        ``noise_w`` and ``length_scale``: [B] float. ``noise``: standard normal [B, 2, T]
        (drawn here when None).
        """
        if noise is None:
            noise = torch.randn_like(x[:, :2])
        logw = self.dp(x, mask, noise * noise_w.view(-1, 1, 1), g=g)
        w = torch.exp(logw) * mask * length_scale.view(-1, 1, 1)
        w_ceil = torch.ceil(w)[:, 0]
        frames = torch.clamp_min(w_ceil.sum(dim=1), 1).long()
        return w_ceil, frames

    #: The phoneme of each frame (``kernels.fused_prior_ref.frame_phonemes``).
    frame_phonemes = staticmethod(fused_prior_ref.frame_phonemes)
    #: Per-frame prior sample ``z_p`` [B, C, n_frames] (``kernels.fused_prior_ref.expand_prior``: frame ``f``
    #: takes phoneme ``i`` with ``cum[i-1] <= f < cum[i]``, Piper's ``generate_path``; past the end noise only).
    expand_prior = staticmethod(fused_prior_ref.expand_prior)

    @staticmethod
    def frame_mask(frames: torch.Tensor, n_frames: int) -> torch.Tensor:
        """``[B, 1, n_frames]`` float mask of the first ``frames[b]`` frames."""
        pos = torch.arange(n_frames, device=frames.device)
        return (pos[None, :] < frames[:, None]).unsqueeze(1).float()

    def synthesize_latents(self, z_p: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """Flow + decoder on a (masked) frame window: ``z_p`` [B, C, F] -> audio [B, F * hop]."""
        z = self.flow.reverse(z_p, mask, g=g)
        return self.dec(z * mask, mask, g=g)

    @torch.inference_mode()
    def infer(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        noise_scale: float | torch.Tensor = 0.667,
        length_scale: float | torch.Tensor = 1.0,
        noise_w: float | torch.Tensor = 0.8,
        sid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole utterances: audio [B, max samples] float32 and samples per utterance [B] int64.

        Each row equals the single-utterance result: the decoder is masked per row (a
        mask of ones changes nothing, so batch 1 is Piper's computation).
        """
        b = ids.shape[0]
        noise_scale, length_scale, noise_w = (
            torch.as_tensor(v, dtype=torch.float32, device=ids.device).expand(b) for v in (noise_scale, length_scale, noise_w)
        )
        g = self.speaker_embedding(sid)
        x, m_p, logs_p, x_mask = self.encode(ids, lengths)
        w_ceil, frames = self.durations(x, x_mask, noise_w, length_scale, g=g)
        n_frames = int(frames.max())
        z_p = self.expand_prior(m_p, logs_p, w_ceil, n_frames, noise_scale)
        y_mask = self.frame_mask(frames, n_frames).to(z_p.dtype)
        audio = self.synthesize_latents(z_p, y_mask, g)
        return audio, frames * self.hop_length
