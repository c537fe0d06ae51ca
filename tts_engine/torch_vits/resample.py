"""Resampling on the device, chunk by chunk, equal to resampling the whole utterance.

The GPU engine's chunks leave the device at the rate clients ask for most (``tts.output_rate``,
24 kHz for the OpenAI Realtime format) instead of the voice's own (22 050 Hz for Piper's medium
voices), so the WebSocket front ends need no resampler of their own: with soxr there, a front
end spent ~46 % of its busy time resampling (``f323a0e:bench/results/tts_load-h200-2026-12-04-fused.md``).

The filter is a Kaiser-windowed sinc, ``taps`` input samples long (``TAPS``; more for
downsampling), its -6 dB point at ``ROLLOFF`` of the lower Nyquist frequency; 80 dB stopband,
which begins below the input's Nyquist frequency when upsampling (no images) and below the
output's when downsampling (no aliases). Each of its ``L`` phases is scaled to a gain of 1 at
0 Hz.

Output sample ``j`` (at ``out_rate``) is the filter centred on input position ``j * M / L``
(``L / M`` = ``out_rate / in_rate`` in lowest terms, so output ``j = 0`` is input 0), over
zeros outside the utterance. Grouping ``G`` output periods into one block of ``Lb = G * L``
outputs fed by ``Mb = G * M`` inputs, block ``q`` is one matrix product of the ``Mb + taps``
inputs from ``Mb * q - taps / 2`` with the ``[Lb, Mb + taps]`` filter matrix: a gather and a
``matmul`` (fp32), captured in the decoder's CUDA graphs. With the decoder's fused kernels
(``fused=True``) one Triton kernel computes each output from its phase's taps and writes int16:
one kernel instead of about fifteen, in the decoder steps small enough for it to be faster
(``FUSED_MAX_SAMPLES``).

A chunk of frames ``[s, e)`` delivers outputs ``[ceil(s*hop*L/M), ceil(e*hop*L/M))``: each
output belongs to the chunk in which its centre lies, and the chunks' outputs join into the
whole utterance's. To compute them the chunk needs exact decoder output ``Mb + taps/2``
samples beyond each side: ``edge_frames`` more decoder frames each side (one, for 22 050 ->
24 000 Hz with hop 256), which the chunk geometry adds to its context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tts_engine.torch_vits.chunked import to_int16
from tts_engine.torch_vits.kernels import triton

#: Filter length in input samples when upsampling (scaled by in/out when downsampling).
TAPS = 128
#: -6 dB point of the filter, as a fraction of the lower Nyquist frequency (soxr's HQ passes ~91 %).
ROLLOFF = 0.95
#: Kaiser window beta for ~80 dB of stopband attenuation.
KAISER_BETA = 7.86
#: Inputs per block at least (small M is grouped so that a block's matrix product is not tiny).
MIN_BLOCK_INPUTS = 128
#: Output samples per program of the fused kernel.
FUSED_BLOCK = 64
#: The fused kernel runs steps of at most this many output samples (rows x row samples); larger ones
#: take the matrix product: each output loads its 128 inputs itself where the product shares them, so
#: the kernel saves launches on small steps and loses on large ones. A first choice from a one-off
#: timing on the H200 (a 256-frame chunk x 48 rows took several times longer as the kernel);
#: ``python -m bench.tts_gpu_experiments --resample --shapes 32x1,32x16,256x1,256x48`` measures both.
FUSED_MAX_SAMPLES = 1 << 18

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _resample_rows(x_ptr, y_ptr, starts_ptr, frames_ptr, taps_ptr, T, X_STRIDE, N_OUT,
                       HOP: tl.constexpr, EDGE: tl.constexpr, UP: tl.constexpr, DOWN: tl.constexpr,
                       BLOCK_OUT: tl.constexpr, TAPS: tl.constexpr, TAPS_P2: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        """Row ``program_id(1)``'s outputs ``[program_id(0) * BLOCK, + BLOCK)`` as int16, laid out as
        ``ChunkResampler.__call__``'s rows (output ``m`` is the utterance's ``(j0 // Lb) * Lb + m``)."""
        row = tl.program_id(1)
        m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        start = tl.load(starts_ptr + row).to(tl.int64)
        total = tl.load(frames_ptr + row).to(tl.int64) * HOP
        first = (start - EDGE) * HOP  # the utterance's index of the row's first input
        j0 = (start * HOP * UP + DOWN - 1) // DOWN
        j = (j0 // BLOCK_OUT) * BLOCK_OUT + m.to(tl.int64)
        phase = (j * DOWN) % UP
        k = tl.arange(0, TAPS_P2)
        n = ((j * DOWN) // UP - (TAPS // 2 - 1))[:, None] + k[None, :]  # the utterance's inputs of each output
        local = n - first
        ok = (n >= 0) & (n < total) & (local >= 0) & (local < T) & (k < TAPS)[None, :] & (m < N_OUT)[:, None]
        x = tl.load(x_ptr + row * X_STRIDE + local, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(taps_ptr + phase[:, None] * TAPS_P2 + k[None, :])
        y = tl.sum(x * w, axis=1) * 32767.0
        y = tl.minimum(tl.maximum(y, -32767.0), 32767.0)
        tl.store(y_ptr + row * N_OUT + m, y.to(tl.int16), mask=m < N_OUT)


def polyphase_taps(in_rate: int, out_rate: int, taps: int) -> np.ndarray:
    """The filter's ``[L, taps]`` float64 taps per phase: output ``j`` of phase ``p = (j * M) % L``
    is ``sum_k taps[p, k] * x[(j * M) // L - taps / 2 + 1 + k]``."""
    g = math.gcd(in_rate, out_rate)
    up, half = out_rate // g, taps // 2
    cutoff = ROLLOFF * min(1.0, out_rate / in_rate)  # in cycles per input sample x 2
    frac = np.arange(up)[:, None] / up
    tau = frac + half - 1 - np.arange(taps)[None, :]  # distance from the centre, input samples
    window = np.i0(KAISER_BETA * np.sqrt(np.clip(1.0 - (tau / half) ** 2, 0.0, None))) / np.i0(KAISER_BETA)
    h = cutoff * np.sinc(cutoff * tau) * window
    return h / h.sum(axis=1, keepdims=True)


def filter_bank(in_rate: int, out_rate: int, taps: int, group: int) -> np.ndarray:
    """The ``[group * L, group * M + taps]`` float64 matrix described in the module docstring."""
    g = math.gcd(in_rate, out_rate)
    up, down = out_rate // g, in_rate // g
    poly = polyphase_taps(in_rate, out_rate, taps)
    bank = np.zeros((group * up, group * down + taps))
    for r in range(group * up):
        base = r * down // up  # output r's taps read the block's inputs base + 1 .. base + taps
        bank[r, base + 1 : base + taps + 1] = poly[(r * down) % up]
    return bank


@dataclass(frozen=True)
class OutputSpan:
    """Where a chunk's output samples go: ``row[offset : offset + (stop - start)]`` is the
    utterance's output samples ``[start, stop)``."""

    offset: int
    start: int
    stop: int

    def of(self, row):  # noqa: ANN001, ANN201 - a row of any array type; its view
        """The span's samples in ``row`` (a row of ``ChunkResampler.__call__`` / ``int16``)."""
        return row[self.offset : self.offset + self.stop - self.start]


class ChunkResampler:
    """Resamples decoder chunks from ``in_rate`` to ``out_rate`` on the decoder's device.

    ``__call__`` is pure tensor work of fixed shapes per chunk size (CUDA-graph friendly);
    ``span`` says on the host which of a row's samples are the chunk's. Equal rates: identity.
    """

    def __init__(self, in_rate: int, out_rate: int, hop: int, device: str | torch.device = "cpu",
                 taps: int = TAPS, fused: bool = False) -> None:  # fmt: skip
        """``fused``: ``int16`` runs one Triton kernel (CUDA, or Triton's interpreter) instead of
        PyTorch's gather + matrix product + conversion: the same sums in another order."""
        if in_rate < 1 or out_rate < 1 or hop < 1:
            raise ValueError(f"rates and hop must be positive, got {in_rate}, {out_rate}, {hop}")
        self.in_rate, self.out_rate, self.hop = in_rate, out_rate, hop
        g = math.gcd(in_rate, out_rate)
        self.up, self.down = out_rate // g, in_rate // g
        self.identity = self.up == self.down
        taps = 2 * math.ceil(taps * max(1.0, in_rate / out_rate) / 2)
        group = math.ceil(MIN_BLOCK_INPUTS / self.down)
        self.taps, self.block_in, self.block_out = taps, group * self.down, group * self.up
        #: Decoder frames needed beyond each side of a chunk (0 when the rates are equal).
        self.edge_frames = 0 if self.identity else math.ceil((self.block_in + taps // 2) / hop)
        bank = filter_bank(in_rate, out_rate, taps, group) if not self.identity else np.eye(1)
        self.bank_t = torch.from_numpy(bank.T.astype(np.float32)).to(device)  # [Mb + taps, Lb]
        self.fused = fused and not self.identity
        #: Largest step (rows x row samples) the fused kernel takes (``FUSED_MAX_SAMPLES``).
        self.fused_max_samples = FUSED_MAX_SAMPLES
        if self.fused:
            if triton is None:
                raise ValueError("the fused resampler needs triton (it comes with PyTorch's CUDA builds)")
            poly = polyphase_taps(in_rate, out_rate, taps)
            self._taps_p2 = 1 << (taps - 1).bit_length()
            padded = np.zeros((self.up, self._taps_p2), np.float32)
            padded[:, :taps] = poly
            self.poly = torch.from_numpy(padded).to(device)  # [L, taps rounded up to a power of two]

    def out_samples(self, in_samples: int) -> int:
        """Output samples of an utterance of ``in_samples`` input samples (``ceil(n * L / M)``)."""
        return -(-in_samples * self.up // self.down)

    def row_samples(self, chunk_frames: int) -> int:
        """Samples of each row ``__call__`` returns for chunks of ``chunk_frames`` frames."""
        if self.identity:
            return chunk_frames * self.hop
        return self._blocks(chunk_frames) * self.block_out

    def span(self, start_frame: int, end_frame: int) -> OutputSpan:
        """The output samples of frames ``[start_frame, end_frame)`` (``end_frame``: the chunk's end
        or the utterance's, whichever is first) and where they are in the chunk's row."""
        start = self.out_samples(start_frame * self.hop)
        stop = self.out_samples(end_frame * self.hop)
        offset = 0 if self.identity else start - (start // self.block_out) * self.block_out
        return OutputSpan(offset, start, stop)

    def _blocks(self, chunk_frames: int) -> int:
        return chunk_frames * self.hop // self.block_in + 2

    def __call__(self, audio: torch.Tensor, starts: torch.Tensor, frames: torch.Tensor, chunk_frames: int) -> torch.Tensor:
        """``audio`` [B, (chunk_frames + 2 * edge_frames) * hop]: the decoder's exact output from frame
        ``starts - edge_frames``; ``frames`` [B]: each utterance's length (0: a padding row).
        Returns float32 [B, row_samples(chunk_frames)]; ``span`` says which samples are the chunk's."""
        if self.identity:
            return audio.float()
        hop, n_in = self.hop, audio.shape[1]
        first = (starts - self.edge_frames) * hop  # global index of the row's first input sample
        pos = first[:, None] + torch.arange(n_in, device=audio.device)[None, :]
        audio = audio.float() * ((pos >= 0) & (pos < (frames * hop)[:, None]))  # zeros outside the utterance
        j0 = (starts * hop * self.up + self.down - 1) // self.down
        seg0 = (j0 // self.block_out) * self.block_in - self.taps // 2 - first  # first block's first input, in the row
        blocks, width = self._blocks(chunk_frames), self.block_in + self.taps
        n = (blocks - 1) * self.block_in + width
        index = (seg0[:, None] + torch.arange(n, device=audio.device)[None, :]).clamp(0, n_in - 1)
        x = torch.gather(audio, 1, index).unfold(1, width, self.block_in)  # [B, blocks, width]
        return torch.matmul(x, self.bank_t).reshape(audio.shape[0], blocks * self.block_out)

    def int16(self, audio: torch.Tensor, starts: torch.Tensor, frames: torch.Tensor, chunk_frames: int) -> torch.Tensor:
        """``__call__`` converted to int16 like ``chunked.to_int16`` (the decoder steps' output)."""
        rows, n_out = audio.shape[0], self.row_samples(chunk_frames)
        if not self.fused or rows * n_out > self.fused_max_samples:
            return to_int16(self(audio, starts, frames, chunk_frames))
        if audio.stride(1) != 1:
            audio = audio.contiguous()
        out = torch.empty(rows, n_out, dtype=torch.int16, device=audio.device)
        grid = (triton.cdiv(n_out, FUSED_BLOCK), rows)
        _resample_rows[grid](audio, out, starts, frames, self.poly, audio.shape[1], audio.stride(0), n_out,
                             HOP=self.hop, EDGE=self.edge_frames, UP=self.up, DOWN=self.down, BLOCK_OUT=self.block_out,
                             TAPS=self.taps, TAPS_P2=self._taps_p2, BLOCK=FUSED_BLOCK)  # fmt: skip
        return out

    def whole(self, audio: torch.Tensor) -> torch.Tensor:
        """One utterance's float audio [N] at ``in_rate`` -> [out_samples(N)] at ``out_rate`` (the
        reference the chunks join into)."""
        if self.identity:
            return audio.float()
        n = audio.shape[0]
        frames = -(-n // self.hop)
        padded = torch.zeros((frames + 2 * self.edge_frames) * self.hop, device=audio.device)
        padded[self.edge_frames * self.hop : self.edge_frames * self.hop + n] = audio.float()
        zero = torch.zeros(1, dtype=torch.long, device=audio.device)
        row = self(padded[None], zero, zero + frames, frames)[0]
        return row[: self.out_samples(n)]
