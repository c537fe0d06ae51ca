"""Flow + decoder on fixed-size frame chunks whose output equals the whole utterance's.

A chunk of ``chunk_frames`` frames starting at frame ``s`` is computed from the window
``[s - context, s + chunk_frames + context)`` of the prior sample ``z_p``: the flow runs
on the whole window, which makes its output exact on the inner
``[s - dec_context, s + chunk_frames + dec_context)``; the decoder runs on that and its
middle ``chunk_frames * hop`` samples are kept. Frames outside the utterance are masked
(the model masks every convolution's input), so windows at the utterance's edges are
exact too. ``context = flow.receptive_radius + dec.receptive_radius`` (32 + 11 frames
for Piper "medium"). Every shape depends only on the batch size: CUDA-graph friendly.
With ``edge_frames`` the decoder's output is exact on that many frames beyond each side too
(what a resampler of the chunk reads: ``resample.ChunkResampler``).

A *first* geometry (``first=True``) is for chunks that start at the utterance's frame 0 (the GPU
engine's fast lanes): the context before such a chunk lies outside the utterance, all masked
zeros, which the convolutions' own zero padding at the window's start gives the same way; its
window starts at the chunk (``32 + 44`` frames instead of ``44 + 32 + 44`` for the medium voices
at 24 kHz output: 37 % less flow work and 21 % less decoder work per first chunk), and its
output gets the ``edge_frames`` before frame 0 as zeros, the layout of every other chunk.

A *flowed* geometry (``flowed=True``, the GPU engine's ``flow_once``) reads windows of ``z``, the
flow's output, which ``pack_flow`` computed once for the rest of the utterance: no flow context, no
flow per chunk. ``pack_flow`` lays several utterances' frames end to end in one row, each after
``flow.conv_radius`` masked frames: the flow masks every convolution's input, so no convolution
reaches from one utterance into the next, and each frame's output is the whole utterance's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tts_engine.torch_vits.model import Vits

#: int16 full scale, as Piper converts (clip to +-32767, truncate).
MAX_WAV_VALUE = 32767.0


@dataclass(frozen=True)
class ChunkGeometry:
    """Sizes of one chunk's computation, in latent frames unless named ``_samples``."""

    #: Frames of audio each chunk delivers.
    chunk_frames: int
    #: Context the flow needs on each side of what the decoder reads.
    flow_context: int
    #: Context the decoder needs on each side of the chunk.
    dec_context: int
    #: Audio samples per frame.
    hop_length: int
    #: Frames of exact decoder output kept beyond each side of the chunk (a resampler's context,
    #: ``resample.ChunkResampler.edge_frames``); the flow and decoder contexts widen by as much.
    edge_frames: int = 0
    #: Chunks that start at frame 0: no context before them (the module docstring).
    first: bool = False
    #: Windows of the flow's output (``pack_flow``), not of ``z_p``: ``flow_context`` is 0 and
    #: ``decode_windows`` runs the decoder alone.
    flowed: bool = False

    @property
    def context(self) -> int:
        """Frames of context after the chunk (and before it, unless ``first``)."""
        return self.flow_context + self.dec_context + self.edge_frames

    @property
    def left_context(self) -> int:
        """Frames of context before the chunk: ``context``, or 0 for a first chunk."""
        return 0 if self.first else self.context

    @property
    def window_frames(self) -> int:
        """Frames of ``z_p`` read per chunk."""
        return self.chunk_frames + self.left_context + self.context

    @property
    def decoder_frames(self) -> int:
        """Frames the decoder runs on per chunk: the window less the flow's context."""
        return self.window_frames - (0 if self.first else self.flow_context) - self.flow_context

    @property
    def chunk_samples(self) -> int:
        return self.chunk_frames * self.hop_length

    @staticmethod
    def for_model(model: Vits, chunk_frames: int, edge_frames: int = 0, first: bool = False,
                  flowed: bool = False) -> ChunkGeometry:  # fmt: skip
        if chunk_frames < 1 or edge_frames < 0:
            raise ValueError(f"chunk_frames must be >= 1 and edge_frames >= 0, got {chunk_frames}, {edge_frames}")
        flow_context = 0 if flowed else model.flow.receptive_radius
        return ChunkGeometry(chunk_frames, flow_context, model.dec.receptive_radius, model.hop_length, edge_frames,
                             first, flowed)  # fmt: skip


def gather_windows(
    latents: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, frames: torch.Tensor, geometry: ChunkGeometry
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read each chunk's ``z_p`` window from per-request frame buffers.

    ``latents`` [S, F_cap, C] (frame-major, one row per request slot); ``slots``,
    ``starts`` (first frame of the chunk; 0 for a ``first`` geometry), ``frames`` (utterance
    length, 0 = padding entry) are [B] int64. Returns ``z`` [B, C, W] (0 outside the utterance)
    and ``mask`` [B, 1, W] float32.
    """
    n_slots, f_cap, channels = latents.shape
    offsets = torch.arange(geometry.window_frames, device=latents.device) - geometry.left_context
    pos = starts[:, None] + offsets[None, :]  # [B, W]
    valid = (pos >= 0) & (pos < frames[:, None])
    rows = slots[:, None] * f_cap + pos.clamp(0, f_cap - 1)
    z = latents.reshape(n_slots * f_cap, channels).index_select(0, rows.reshape(-1))
    mask = valid.unsqueeze(1).to(latents.dtype)
    z = z.view(pos.shape[0], pos.shape[1], channels).transpose(1, 2) * mask
    return z, mask


def decode_windows(
    model: Vits, z: torch.Tensor, mask: torch.Tensor, geometry: ChunkGeometry, g: torch.Tensor | None = None
) -> torch.Tensor:
    """``z`` [B, C, W], ``mask`` [B, 1, W] (model dtype) -> float audio
    [B, (W - left_context - context + 2 * edge_frames) * hop]: the chunk and ``edge_frames`` on each
    side (before a ``first`` chunk: zeros).

    Only the contexts of ``geometry`` are used, so any window width works (ONNX export).
    """
    if not geometry.flowed:
        z = model.flow.reverse(z, mask, g=g)
    fc, dc = geometry.flow_context, geometry.dec_context * geometry.hop_length
    before_fc, before_dc = (0, 0) if geometry.first else (fc, dc)  # a first chunk has no context before it
    z, mask = z[:, :, before_fc : -fc or None], mask[:, :, before_fc : -fc or None]
    audio = model.dec(z * mask, mask, g=g)[:, before_dc : -dc or None]
    if geometry.first:  # the edge before frame 0 (outside the utterance: zeros), where every other chunk's row has it
        audio = torch.nn.functional.pad(audio, (geometry.edge_frames * geometry.hop_length, 0))
    return audio


#: Most utterances one packed flow launch holds (``pack_flow``; a row of ``FlowPack.table`` each).
FLOW_PACK_SEGMENTS = 64


@dataclass(frozen=True)
class FlowPack:
    """One packed flow launch of ``frames`` positions (a flow bucket): ``table`` [``FLOW_PACK_SEGMENTS``,
    5] int64, a row per utterance (slot, first frame the flow reads, first frame whose output is kept,
    its end frame, its first position in the launch), the rest padding (no frames, starting at
    ``frames``); ``flow_positions`` expands it on the device."""

    frames: int
    table: np.ndarray
    #: Positions holding utterance frames (the rest: gaps and padding).
    used: int


def padding_table(frames: int) -> np.ndarray:
    """A ``FlowPack.table`` of padding rows only (no frames, starting at ``frames``, after every
    position): a launch of ``frames`` masked positions, each written to a scratch row."""
    table = np.zeros((FLOW_PACK_SEGMENTS, 5), np.int64)
    table[:, 4] = frames
    return table


def pack_flow(segments: Sequence[tuple[int, int, int]], max_frames: int, buckets: Sequence[int], flow_context: int,
              gap: int, reach: int = 0) -> list[FlowPack]:  # fmt: skip
    """Lay out the flow over each segment ``(slot, start, frames)``: the flow's output is wanted exact
    on frames ``[keep_from, frames)`` of ``slot``'s utterance, ``keep_from`` = ``start`` less ``reach``
    (what a chunk's decoder window reads before it: decoder and resampler context; not before frame
    0), so the flow reads from ``flow_context`` frames before (not before frame 0) to the utterance's end, followed by ``gap``
    masked frames (``flow.conv_radius``). Segments fill a launch in order up to the largest of
    ``buckets`` (ascending) or ``FLOW_PACK_SEGMENTS`` of them, each launch then the smallest bucket
    that holds it."""
    largest = buckets[-1]
    packs: list[list[tuple[int, int, int, int, int]]] = [[]]  # per launch: (slot, read_from, keep_from, frames, at)
    used = 0
    for slot, start, frames in segments:
        keep_from = max(0, start - reach)
        if not 0 <= keep_from < frames <= max_frames:
            raise ValueError(f"segment frames [{keep_from}, {frames}) outside the utterance (max_frames {max_frames})")
        read_from = max(0, keep_from - flow_context)
        need = frames - read_from + gap
        if need > largest:
            raise ValueError(f"{need} frames of flow exceed the largest flow bucket {largest}")
        if used + need > largest or len(packs[-1]) == FLOW_PACK_SEGMENTS:
            packs.append([])
            used = 0
        packs[-1].append((slot, read_from, keep_from, frames, used))
        used += need
    out = []
    for pack in packs:
        if not pack:
            continue
        slot, read_from, keep_from, frames, at = pack[-1]
        size = next(b for b in buckets if b >= at + frames - read_from + gap)
        table = padding_table(size)
        table[: len(pack)] = pack
        out.append(FlowPack(size, table, int((table[:, 3] - table[:, 1])[: len(pack)].sum())))
    return out


def flow_positions(table: torch.Tensor, frames: int, max_frames: int, scratch: int,
                   scratch_slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """A ``FlowPack.table`` (on the device) -> per position of its ``frames`` the row of the flat
    ``[slots * max_frames, C]`` latents it reads (``src``; a masked gap or padding position: the
    ``scratch_slot``'s first), whether it is an utterance frame (``valid``, float 1.0 / 0.0) and the
    row of the flat flowed buffer its output goes to (``dst``: the frame's own where its output is
    kept, else ``scratch`` + position, a row of its own). Fixed shapes: capturable in a CUDA graph."""
    slot, read_from, keep_from, end, at = table.unbind(1)
    position = torch.arange(frames, device=table.device)
    seg = (torch.searchsorted(at.contiguous(), position, right=True) - 1).clamp_min(0)
    offset = position - at[seg]
    inside = (offset >= 0) & (offset < end[seg] - read_from[seg])  # before the first segment (a table of padding only): none
    rows = slot[seg] * max_frames + read_from[seg] + offset
    src = torch.where(inside, rows, scratch_slot * max_frames)
    dst = torch.where(inside & (offset >= keep_from[seg] - read_from[seg]), rows, scratch + position)
    return src, inside.to(torch.float32), dst


def to_int16(audio: torch.Tensor) -> torch.Tensor:
    """Float audio in [-1, 1] -> int16, clipped and truncated like Piper."""
    return (audio.float() * MAX_WAV_VALUE).clamp(-MAX_WAV_VALUE, MAX_WAV_VALUE).to(torch.int16)


def decode_chunked(model: Vits, z_p: torch.Tensor, frames: int, chunk_frames: int) -> torch.Tensor:
    """One utterance's prior sample ``z_p`` [1, C, >= frames] -> float audio [frames * hop], chunk by chunk.

    The reference chunked path (eager, any device); the GPU engine batches the same
    ``gather_windows`` + ``decode_windows`` across requests.
    """
    geometry = ChunkGeometry.for_model(model, chunk_frames)
    latents = z_p[:, :, :frames].transpose(1, 2).contiguous()  # [1, F, C]
    one = torch.zeros(1, dtype=torch.long, device=z_p.device)
    pieces = []
    for start in range(0, frames, chunk_frames):
        z, mask = gather_windows(latents, one, one + start, one + frames, geometry)
        pieces.append(decode_windows(model, z, mask, geometry)[0])
    return torch.cat(pieces)[: frames * geometry.hop_length]
