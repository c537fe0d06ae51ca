"""INT8 convolutions for the HiFi-GAN decoder (``tts.precision = "int8"``).

``Int8Conv1d`` replaces a stride-1 ``nn.Conv1d`` (any dilation, "same" zero padding) by
one ``torch._int_mm`` (int8 x int8 -> int32) on an im2col matrix:

- weights: symmetric int8, one scale per output channel, stored as ``[Cout, K * Cin]``
  (tap-major, channel-minor); the GEMM is ``W @ cols^T`` with both operands K-contiguous
  (the "TN" layout cuBLASLt's int8 kernels want) and a channel-major ``[Cout, B * L]``
  result, dequantized straight into ``[B, Cout, L]``;
- activations: symmetric int8 with either a *static* per-tensor scale (the default;
  calibrated: the input is quantized first, then the ``[B * L, K * Cin]`` int8 matrix is
  built channels-last from ``K`` shifted slices) or a *dynamic* per-row scale (one per
  output sample, the ``amax`` of its float im2col row, computed on the fly: better SNR,
  more memory traffic). Static mode evens the input channels' ranges first (SmoothQuant:
  ``x[c] / s[c]``, ``w[:, c] * s[c]``) and clips at the bound that minimizes the expected
  squared error on the calibration set (or at a percentile, or the amax);
- output: ``int32 * act_scale * w_scale[c] + bias`` computed in float32 and written in
  the input's dtype (fp16 on GPU, float32 on CPU), ``[B, Cout, L]`` contiguous.

``torch._int_mm(a, b)`` on CUDA needs ``a.size(0) > 16`` and ``a.size(1)``, ``b.size(1)``
multiples of 8: here ``Cout > 16``, ``K * Cin % 8 == 0`` (layers that break them, e.g.
``conv_post`` with 1 output channel, stay float) and ``B * L`` is made a multiple of 8
by padding ``L``. Upsampling (``ConvTranspose1d``) and the flow stay in the float dtype.

``quantize_decoder`` swaps the decoder's ResBlock ``Conv1d`` layers (and ``conv_pre``
if asked) in place; static scales come from forward pre-hooks (``observe``) on a float
run over calibration latents (``calibration_latents``: the committed sentences of
``calibration_sentences.json`` through the real encoder and flow). ``int8_synth_model``
is what ``StepRunner`` calls for ``precision = "int8"`` (``DEFAULT_OPTIONS``).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from tts_engine.torch_vits.model import Vits
from base.errors import ConfigError

log = logging.getLogger(__name__)

#: Phoneme ids (and texts) of the calibration set, frozen for the bundled voice.
CALIBRATION_SENTENCES = Path(__file__).with_name("calibration_sentences.json")
QMAX = 127
#: Smallest per-row bound of dynamic quantization (|x| below it: steps of 3e-5 at most).
MIN_ROW_AMAX = 2.0**-8
#: ``torch._int_mm`` on CUDA: the first operand's rows (here: output channels) must exceed this.
MIN_ROWS = 16
#: Histograms of log2|x| (percentiles, clipping search): range and bin width, octaves.
_LOG2_MIN, _LOG2_MAX, _BIN = -24.0, 16.0, 0.02


@dataclass(frozen=True)
class Int8Options:
    """How the decoder is quantized."""

    #: "static": one calibrated scale per layer (the input is quantized before im2col);
    #: "dynamic": per-row scales computed on the fly (no calibration; the float im2col
    #: matrix is built, then quantized: ~5x the memory traffic of static before the GEMM).
    mode: str = "static"
    #: Static mode: the scale's bound on |x / smooth|: a percentile over the calibration
    #: set, "mse" (the bound minimizing the expected squared error), or None (the amax).
    clip: float | str | None = "mse"
    #: Static mode: SmoothQuant migration strength; input channel ``c`` is divided by
    #: ``amax_x[c]^alpha / amax_w[c]^(1 - alpha)`` and the weights multiplied by it.
    #: 0 turns it off.
    smooth_alpha: float = 0.8
    #: Also quantize ``conv_pre`` (frame rate, ~1 % of the decoder's work, but the
    #: layer most sensitive to int8: ~2 dB of SNR).
    conv_pre: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ("static", "dynamic"):
            raise ValueError(f"mode must be 'static' or 'dynamic', got {self.mode!r}")
        if self.clip not in (None, "mse") and not (
            isinstance(self.clip, float) and 50.0 < self.clip <= 100.0
        ):
            raise ValueError(
                f"clip must be a percentile in (50, 100], 'mse' or None, got {self.clip!r}"
            )
        if not 0.0 <= self.smooth_alpha <= 1.0:
            raise ValueError(f"smooth_alpha must be in [0, 1], got {self.smooth_alpha}")


#: What ``StepRunner`` uses for ``precision = "int8"``. SNR vs float32 on 3 benchmark sentences
#: (CPU, noise 0, 256-frame chunks): static 24.4 dB (amax clipping and no smoothing: 17.1 dB; a
#: 99.999th percentile: 19.8 dB), dynamic 29.0 dB, int8 weights with float activations 31.0 dB;
#: GPU bf16 reaches 19.7-24.2 dB with fp32's WER. Static is the default for its cost: on CPU
#: (2 shared cores, batch 4, chunk 256) a decode step took ~1.2 s static, ~3.0 s dynamic, ~0.8 s
#: fp32 (eager; GPU figures: bench/tts_int8.py).
DEFAULT_OPTIONS = Int8Options()


def supports(conv: nn.Conv1d) -> bool:
    """Whether ``Int8Conv1d`` can replace ``conv`` (shape rules of ``torch._int_mm``)."""
    if type(conv) is not nn.Conv1d:
        return False
    k, cin, cout = conv.kernel_size[0], conv.in_channels, conv.out_channels
    return (
        conv.stride == (1,)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
        and isinstance(conv.padding, tuple)
        and 2 * conv.padding[0] == conv.dilation[0] * (k - 1)  # same length out
        and (cin * k) % 8 == 0
        and cout > MIN_ROWS
    )


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[Cout, Cin, K]`` float -> (int8 ``[Cout, K * Cin]`` tap-major, float32 scale ``[Cout]``)."""
    w = weight.detach().float().permute(0, 2, 1).reshape(weight.shape[0], -1)
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / QMAX
    q = torch.round(w / scale[:, None]).clamp(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale


def im2col(
    x: torch.Tensor, kernel: int, dilation: int, padding: int, rows: int | None = None
) -> torch.Tensor:
    """``[B, C, L]`` -> ``[B * R, K * C]``: row ``b * R + t`` holds input samples
    ``t - p + j * d`` (tap ``j`` major, channel minor); ``R = rows`` (default ``L``; the
    rows past ``L`` read zero padding).

    Channels-last and contiguous: one transposing pad, then one stack of ``K`` shifted slices.
    """
    b, c, length = x.shape
    rows = rows or length
    xt = F.pad(x.transpose(1, 2), (0, 0, padding, padding + rows - length))
    taps = [xt[:, j * dilation : j * dilation + rows] for j in range(kernel)]
    return torch.stack(taps, dim=2).view(b * rows, kernel * c)


def row_bounds(
    x: torch.Tensor, kernel: int, dilation: int, padding: int, rows: int
) -> torch.Tensor:
    """``max |x|`` over each im2col row (``[B * rows, 1]``, input dtype): the channels'
    ``amax`` per sample, then its max over the ``kernel`` taps (a dilated max-pool), which
    reads ``x`` once instead of the ``K`` times larger im2col matrix."""
    b, _, length = x.shape
    # Zero padding = the conv's (max_pool1d's own is limited to half the kernel).
    amax = F.pad(x.abs().amax(dim=1, keepdim=True), (padding, padding + rows - length))
    pooled = F.max_pool1d(amax, kernel, 1, 0, dilation)  # [B, 1, rows]
    return pooled.reshape(b * rows, 1)


def quantize_rows(
    cols: torch.Tensor, amax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float ``[M, K]`` with row bounds ``amax`` ``[M, 1]`` -> (int8 ``[M, K]``, float32 scale
    ``[M, 1]``), in the input dtype. Bounds below ``MIN_ROW_AMAX`` are raised to it
    (all-zero masked rows; keeps ``127 / amax`` finite in fp16)."""
    amax = amax.clamp_min(MIN_ROW_AMAX)
    # |cols * 127 / amax| <= 127 up to fp16 rounding (< 0.2 %): rounds to <= 127, no clamp needed.
    q = torch.round(cols * (QMAX / amax)).to(torch.int8)
    return q, amax.float() / QMAX


class Int8Conv1d(nn.Module):
    """A stride-1 "same" ``Conv1d`` on int8 GEMMs: ``[B, Cin, L]`` -> ``[B, Cout, L]`` (input dtype)."""

    def __init__(
        self,
        conv: nn.Conv1d,
        act_amax: float | None = None,
        dynamic: bool = False,
        smooth: torch.Tensor | None = None,
    ) -> None:
        """``act_amax``: calibrated bound of ``|x / smooth|`` (static mode); ``dynamic``: per-row
        scales instead; ``smooth``: per-input-channel factors [Cin] (``ActivationObserver.smoothing``)
        dividing the input and multiplying the weights before quantization (static mode)."""
        super().__init__()
        if not supports(conv):
            raise ValueError(
                f"Int8Conv1d cannot replace {conv} (needs stride 1, same padding, "
                "Cin * K % 8 == 0, Cout > 16)"
            )
        if not dynamic and (act_amax is None or not act_amax > 0):
            raise ValueError(
                f"static quantization needs a positive act_amax, got {act_amax}"
            )
        dev = conv.weight.device
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel, self.dilation = conv.kernel_size[0], conv.dilation[0]
        self.padding = conv.padding[0]
        self.dynamic = dynamic
        if smooth is None or dynamic:
            smooth = torch.ones(conv.in_channels, device=dev)
        smooth = smooth.float().to(dev)
        q, scale = quantize_weight(conv.weight.detach().float() * smooth[None, :, None])
        self.register_buffer("weight", q)  # int8 [Cout, K * Cin]
        self.register_buffer("weight_scale", scale)  # float32 [Cout]
        bias = torch.zeros_like(scale) if conv.bias is None else conv.bias.detach()
        self.register_buffer("bias", bias.float())
        act_scale = 1.0 if dynamic else act_amax / QMAX
        self.register_buffer("act_scale", torch.tensor(act_scale, device=dev))
        inv = (1.0 / (act_scale * smooth))[:, None]
        self.register_buffer("act_inv", inv)  # float32 [Cin, 1]
        #: Quantize fp16 input in fp16 (half the memory traffic; exact for integers up to 2048).
        self.half_ok = bool(self.act_inv.max() < 3e4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, length = x.shape
        rows = -(-length // 8) * 8  # B * rows: a multiple of 8, as _int_mm wants
        args = (self.kernel, self.dilation, self.padding, rows)
        if self.dynamic:
            q, row_scale = quantize_rows(im2col(x, *args), row_bounds(x, *args))
        else:
            inv = self.act_inv.to(x.dtype) if self.half_ok else self.act_inv
            xq = torch.round(x * inv).clamp_(-QMAX, QMAX).to(torch.int8)
            q, row_scale = im2col(xq, *args), None
        # [Cout, B * rows] = W @ q^T: both operands K-contiguous, output channel-major.
        acc = torch._int_mm(self.weight, q.t())
        if row_scale is not None:
            acc = acc * row_scale.view(1, -1)  # float32
        acc = acc.view(self.out_channels, b, rows)[:, :, :length]
        scale = (
            self.weight_scale if self.dynamic else self.act_scale * self.weight_scale
        )
        out = torch.empty(b, self.out_channels, length, dtype=x.dtype, device=x.device)
        # Dequantize, add the bias and cast in one pass, written [B, Cout, L].
        torch.addcmul(
            self.bias[:, None, None], acc, scale[:, None, None], out=out.transpose(0, 1)
        )
        return out

    def extra_repr(self) -> str:
        mode = "dynamic" if self.dynamic else f"act_scale={float(self.act_scale):.3g}"
        return (
            f"{self.in_channels}, {self.out_channels}, kernel={self.kernel}, "
            f"dilation={self.dilation}, {mode}"
        )


# ---------------------------------------------------------------- calibration


class ActivationObserver:
    """Per input channel: running ``amax`` and a histogram of ``log2 |x|`` of one layer's inputs.

    Bins are ``_BIN`` octaves wide over ``[_LOG2_MIN, _LOG2_MAX)``; zeros (masked samples)
    count below the first bin. Per-channel histograms give the per-tensor statistics of
    ``x / smooth[c]`` for any smoothing by shifting each channel's bins.
    """

    def __init__(self) -> None:
        self.channel_amax: torch.Tensor | None = None  # [C] float32
        self.hist: torch.Tensor | None = None  # [C, bins] int64
        self.count = 0

    def update(self, x: torch.Tensor) -> None:
        c = x.shape[1]
        a = x.detach().abs().float().transpose(0, 1).reshape(c, -1)
        amax = a.amax(dim=1)
        bins = round((_LOG2_MAX - _LOG2_MIN) / _BIN)
        idx = ((torch.log2(a) - _LOG2_MIN) / _BIN).floor().clamp(0, bins - 1).long()
        idx = idx + torch.arange(c, device=a.device)[:, None] * bins
        hist = torch.bincount(idx[a > 0], minlength=c * bins).view(c, bins)
        self.count += a.shape[1]  # per channel
        if self.hist is None:
            self.channel_amax, self.hist = amax, hist
        else:
            self.channel_amax = torch.maximum(self.channel_amax, amax)
            self.hist += hist

    @property
    def amax(self) -> float:
        return 0.0 if self.channel_amax is None else float(self.channel_amax.max())

    def _combined(self, smooth: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        """Histogram of ``log2 |x / smooth|`` over all channels (float64, CPU) and its first bin's log2."""
        hist = self.hist.double().cpu()
        if smooth is None:
            return hist.sum(0), _LOG2_MIN
        shifts = torch.round(-torch.log2(smooth.double().cpu()) / _BIN).long()
        lo = int(shifts.min())
        out = torch.zeros(hist.shape[1] + int(shifts.max()) - lo, dtype=torch.float64)
        for c, sh in enumerate(shifts.tolist()):
            out[sh - lo : sh - lo + hist.shape[1]] += hist[c]
        return out, _LOG2_MIN + lo * _BIN

    def bound(
        self, percentile: float | None, smooth: torch.Tensor | None = None
    ) -> float:
        """``|x / smooth|`` at ``percentile`` (upper edge of its bin, at most the amax); None: the amax."""
        div = 1.0 if smooth is None else smooth.to(self.channel_amax)
        amax = float((self.channel_amax / div).max())
        if percentile is None or percentile >= 100.0:
            return amax
        hist, first = self._combined(smooth)
        total = self.count * self.hist.shape[0]
        cum = torch.cumsum(hist, 0) + (total - float(hist.sum()))
        target = torch.tensor(percentile / 100.0 * total, dtype=torch.float64)
        i = int(torch.searchsorted(cum, target))
        return min(amax, 2.0 ** (first + (i + 1) * _BIN))

    def mse_bound(self, smooth: torch.Tensor | None = None) -> float:
        """The clipping bound ``T`` minimizing the expected squared error of int8 quantization of
        ``x / smooth`` (clipping above ``T``, rounding noise ``min(x^2, (T/127)^2 / 12)`` below)."""
        hist, first = self._combined(smooth)
        centers = 2.0 ** (
            first + (torch.arange(hist.shape[0], dtype=torch.float64) + 0.5) * _BIN
        )
        amax = self.bound(None, smooth)
        best, best_err = amax, float("inf")
        lo, hi = math.log10(amax / 64), math.log10(amax)
        for t in torch.logspace(lo, hi, 200, dtype=torch.float64).tolist():
            clip = torch.clamp(centers - t, min=0.0) ** 2
            noise = torch.minimum(centers**2, torch.tensor((t / QMAX) ** 2 / 12))
            err = float((hist * torch.where(centers > t, clip, noise)).sum())
            if err < best_err:
                best, best_err = t, err
        return best

    def smoothing(self, weight: torch.Tensor, alpha: float) -> torch.Tensor:
        """SmoothQuant factors ``s[c] = amax_x[c]^alpha / amax_w[c]^(1 - alpha)`` (float32 [Cin]).

        ``x[c] / s[c]`` and ``w[:, c] * s[c]`` give the same convolution with the input
        channels' ranges evened out (part of the spread moved into the weights)."""
        w = weight.detach().float().abs().amax(dim=(0, 2)).clamp_min(1e-8)
        x = self.channel_amax.float().to(w.device).clamp_min(1e-8)
        s = x**alpha / w ** (1.0 - alpha)
        return s / torch.exp(torch.log(s).mean())  # geometric mean 1


def quantizable_convs(dec: nn.Module, options: Int8Options) -> dict[str, nn.Conv1d]:
    """The decoder ``Conv1d`` layers ``options`` quantizes (by name), those ``supports`` accepts."""
    convs = {}
    for name, mod in dec.named_modules():
        if not supports(mod):
            continue
        if name == "conv_pre" and not options.conv_pre:
            continue
        if name == "cond":  # speaker conditioning: a 1x1 on [B, gin, 1], negligible
            continue
        convs[name] = mod
    return convs


def observe(
    dec: nn.Module, names: Sequence[str], run: Callable[[], object]
) -> dict[str, ActivationObserver]:
    """Call ``run()`` with forward pre-hooks recording the inputs of ``dec``'s layers ``names``."""
    observers = {name: ActivationObserver() for name in names}
    modules = dict(dec.named_modules())
    handles = [
        modules[name].register_forward_pre_hook(lambda _m, args, o=o: o.update(args[0]))
        for name, o in observers.items()
    ]
    try:
        with torch.inference_mode():
            run()
    finally:
        for h in handles:
            h.remove()
    return observers


def load_calibration_ids(path: Path = CALIBRATION_SENTENCES) -> list[list[int]]:
    """Phoneme ids of the committed calibration sentences."""
    return [s["ids"] for s in json.loads(path.read_text())["sentences"]]


def calibration_latents(
    model: Vits,
    sentences: Sequence[Sequence[int]],
    noise_scale: float = 0.667,
    noise_w: float = 0.8,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Decoder inputs ``z`` [1, C, F] for each sentence: encoder, durations, prior, flow (float32).

    Noise comes from a seeded generator (the global RNG is left alone), so
    calibration is reproducible; one sentence at a time (no padding in the statistics).
    """
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = []
    with torch.inference_mode():
        for ids in sentences:
            x_ids = torch.tensor([list(ids)], device=dev)
            lengths = torch.tensor([len(ids)], device=dev)
            one = torch.ones(1, device=dev)
            x, m_p, logs_p, x_mask = model.encode(x_ids, lengths)
            noise = torch.randn(x[:, :2].shape, generator=gen, device=dev)
            w_ceil, frames = model.durations(x, x_mask, one * noise_w, one, noise=noise)
            n = int(frames.max())
            prior_noise = torch.randn((1, m_p.shape[1], n), generator=gen, device=dev)
            z_p = model.expand_prior(
                m_p, logs_p, w_ceil, n, one * noise_scale, noise=prior_noise
            )
            out.append(model.flow.reverse(z_p, torch.ones(1, 1, n, device=dev)))
    return out


#: Decoder-input latents [1, C, F], or a callable that runs the model.
Calibration = Sequence[torch.Tensor] | Callable[[], object] | None


def quantize_decoder(
    model: Vits, calibration: Calibration = None, options: Int8Options | None = None
) -> dict[str, ActivationObserver]:
    """Replace ``model.dec``'s quantizable ``Conv1d`` layers by ``Int8Conv1d``, in place.

    ``calibration`` (static mode): decoder-input latents ``[1, C, F]`` (run through
    ``model.dec`` here) or a callable that runs the model (with hooks on ``model.dec``).
    Dynamic mode needs none. Returns the observers (empty in dynamic mode).
    ``options``: default ``DEFAULT_OPTIONS``.
    """
    options = options or DEFAULT_OPTIONS
    convs = quantizable_convs(model.dec, options)
    observers: dict[str, ActivationObserver] = {}
    if options.mode == "static":
        if calibration is None:
            raise ValueError("static int8 quantization needs calibration data")
        if not callable(calibration):
            latents, dtype = calibration, next(model.dec.parameters()).dtype
            calibration = lambda: [model.dec(z.to(dtype)) for z in latents]  # noqa: E731
        observers = observe(model.dec, list(convs), calibration)
        missing = [n for n, o in observers.items() if o.amax <= 0]
        if missing:
            raise ValueError(f"no calibration data for {missing[:3]}")
    modules = dict(model.dec.named_modules())
    for name, conv in convs.items():
        amax, smooth, obs = None, None, observers.get(name)
        if obs is not None:
            if options.smooth_alpha:
                smooth = obs.smoothing(conv.weight, options.smooth_alpha)
            clip = options.clip
            amax = obs.mse_bound(smooth) if clip == "mse" else obs.bound(clip, smooth)
        q = Int8Conv1d(
            conv, act_amax=amax, dynamic=options.mode == "dynamic", smooth=smooth
        )
        parent, _, attr = name.rpartition(".")
        setattr(modules[parent] if parent else model.dec, attr, q)
    return observers


def cast_float(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)`` in place, except ``Int8Conv1d`` layers: their scales and biases
    stay float32 (a weight scale of ~1e-5 is subnormal in fp16)."""
    for mod in model.modules():
        if isinstance(mod, Int8Conv1d):
            continue
        for name, p in mod.named_parameters(recurse=False):
            if p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, b in mod.named_buffers(recurse=False):
            if b.is_floating_point():
                mod._buffers[name] = b.to(dtype)


def int8_synth_model(
    model: Vits,
    options: Int8Options | None = None,
    sentences: Sequence[Sequence[int]] | None = None,
) -> tuple[Vits, torch.dtype]:
    """The flow + decoder model of ``precision = "int8"`` and its float dtype.

    ``model``: float32, on its device. Static mode calibrates on ``sentences`` (default:
    the committed set) with the float32 model. Returns a copy with int8 decoder
    convolutions and the rest in fp16 on CUDA, float32 on CPU (fp16 convolutions are
    slow there). ``options``: default ``DEFAULT_OPTIONS``.
    """
    options = options or DEFAULT_OPTIONS
    dev = next(model.parameters()).device
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    synth = copy.deepcopy(model)  # float32 until quantized (calibration, weights)
    latents = None
    if options.mode == "static":
        sentences = load_calibration_ids() if sentences is None else sentences
        if any(not 0 <= i < model.config.n_vocab for ids in sentences for i in ids):
            raise ConfigError(
                f"the int8 calibration set ({CALIBRATION_SENTENCES.name}) has phoneme ids "
                f"outside this voice's {model.config.n_vocab} symbols; use another precision"
            )
        latents = calibration_latents(model, sentences)
    quantize_decoder(synth, latents, options)
    cast_float(synth, dtype)
    if (
        dev.type == "cuda"
    ):  # calibration's activations: not part of the engine's footprint
        torch.cuda.empty_cache()
    n = sum(isinstance(m, Int8Conv1d) for m in synth.dec.modules())
    how = "dynamic" if latents is None else f"static, {len(latents)} sentences"
    elapsed = time.perf_counter() - t0
    log.info("int8 decoder: %d convolutions quantized (%s) in %.1f s", n, how, elapsed)
    return synth, dtype
