"""Load ``Vits`` weights from a Piper voice ``.onnx`` or a PyTorch checkpoint.

ONNX: Piper's export keeps most parameters as named initializers; weight-normed
convolutions (the flow's WaveNet) were folded by the exporter into anonymous
``onnx::Conv_N`` tensors, so those are named by the Conv node that reads them
(``/flow/flows.0/enc/in_layers.0/Conv`` -> ``flow.flows.0.enc.in_layers.0.weight``).
The text embedding may be stored under the name ``sid`` (an exporter quirk); it is
found through its Gather node. ``dp.flows.0.logs`` survives only as ``exp(-logs)``.
Hyper-parameters are read from tensor shapes and Conv attributes.

Checkpoint: a Piper/Lightning ``.ckpt`` (``state_dict`` with ``model_g.`` keys, weight
norm as ``weight_g``/``weight_v`` or ``parametrizations.weight.original0/1``, optional
``hyper_parameters``), or ``{"config": {...}, "state_dict": {...}}`` saved by ``save_checkpoint``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tts_engine.torch_vits.model import Vits, VitsConfig
from base.errors import ModelError

#: Prefixes of parameters used only in training (posterior encoder, discriminators, ...).
_TRAINING_ONLY = ("enc_q.", "dp.post_", "dp.flows.1.", "model_d.", "net_dur_disc.")


def load_vits(path: str | Path, device: str | torch.device = "cpu") -> Vits:
    """A ``Vits`` in eval mode, float32, on ``device``, from ``.onnx`` or a checkpoint."""
    p = Path(path)
    if p.suffix == ".onnx":
        config, state = state_dict_from_onnx(p)
    else:
        config, state = state_dict_from_checkpoint(p)
    model = Vits(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelError(f"{p}: weights do not fit the VITS model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model.eval().to(device)


def save_checkpoint(model: Vits, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
    """Write ``{"config", "state_dict"}`` (``dtype`` weights; float16 halves the file)."""
    state = {k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}
    torch.save({"config": dataclasses.asdict(model.config), "state_dict": state}, Path(path))


# ---------------------------------------------------------------- ONNX


def state_dict_from_onnx(path: str | Path) -> tuple[VitsConfig, dict[str, torch.Tensor]]:
    """Parameters (float32) and hyper-parameters of a Piper VITS ``.onnx``."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:  # pragma: no cover - install hint
        raise ModelError("loading a .onnx voice into PyTorch needs `pip install onnx`") from exc
    try:
        graph = onnx.load(str(path)).graph
    except Exception as exc:  # onnx raises DecodeError / OSError
        raise ModelError(f"cannot read {path} as ONNX: {exc}") from None
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    state: dict[str, np.ndarray] = {k: v for k, v in arrays.items() if _is_param_name(k)}
    conv_attrs: dict[str, dict[str, Any]] = {}
    for node in graph.node:
        module = _module_path(node.name)
        if node.op_type in ("Conv", "ConvTranspose") and module:
            conv_attrs[module] = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            for slot, suffix in ((1, "weight"), (2, "bias")):
                if len(node.input) > slot and node.input[slot] in arrays:
                    state.setdefault(f"{module}.{suffix}", arrays[node.input[slot]])
        elif node.op_type == "Gather" and module in ("enc_p.emb", "emb_g"):
            if node.input and node.input[0] in arrays:
                state[f"{module}.weight"] = arrays[node.input[0]]
    if "dp.flows.0.logs" not in state:
        folded = arrays.get("/dp/flows.0/Exp_output_0")
        if folded is None:
            raise ModelError(f"{path}: no dp.flows.0.logs in the graph; not a Piper VITS export?")
        state["dp.flows.0.logs"] = -np.log(folded)
    if "enc_p.emb.weight" not in state:
        raise ModelError(f"{path}: no text embedding found; not a Piper VITS export?")
    tensors = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}
    return _config_from_shapes(tensors, conv_attrs), tensors


def _is_param_name(name: str) -> bool:
    return re.fullmatch(r"[a-z_]+[\w.]*\.(weight|bias|gamma|beta|emb_rel_k|emb_rel_v|m|logs)", name) is not None


def _module_path(node_name: str) -> str:
    """``/flow/flows.0/enc/in_layers.0/Conv`` -> ``flow.flows.0.enc.in_layers.0``."""
    parts = node_name.strip("/").split("/")
    return ".".join(parts[:-1]) if len(parts) > 1 else ""


def _count(state: Mapping[str, Any], pattern: str) -> int:
    """How many consecutive ``i`` make ``pattern.format(i)`` a key."""
    n = 0
    while pattern.format(n) in state:
        n += 1
    return n


def _config_from_shapes(
    state: Mapping[str, torch.Tensor], conv_attrs: Mapping[str, Mapping[str, Any]], hparams: Mapping[str, Any] | None = None
) -> VitsConfig:
    """Hyper-parameters from shapes; dilations and strides from ONNX attributes or ``hparams``."""
    hparams = hparams or {}
    n_vocab, hidden = state["enc_p.emb.weight"].shape
    rel_k = state["enc_p.encoder.attn_layers.0.emb_rel_k"]
    ffn = state["enc_p.encoder.ffn_layers.0.conv_1.weight"]
    n_ups = _count(state, "dec.ups.{}.weight")
    resblock = "1" if "dec.resblocks.0.convs1.0.weight" in state else "2"
    n_blocks = _count(state, "dec.resblocks.{}." + ("convs1.0.weight" if resblock == "1" else "convs.0.weight"))
    n_kernels = n_blocks // n_ups
    first = "convs1" if resblock == "1" else "convs"
    kernels, dilations = [], []
    for j in range(n_kernels):
        n_convs = _count(state, f"dec.resblocks.{j}.{first}.{{}}.weight")
        kernels.append(int(state[f"dec.resblocks.{j}.{first}.0.weight"].shape[2]))
        dilations.append(
            tuple(int(conv_attrs.get(f"dec.resblocks.{j}.{first}.{i}", {}).get("dilations", [0])[0]) for i in range(n_convs))
        )
    up_kernels = tuple(int(state[f"dec.ups.{i}.weight"].shape[2]) for i in range(n_ups))
    up_rates = tuple(
        int(conv_attrs.get(f"dec.ups.{i}", {}).get("strides", [k // 2])[0]) for i, k in enumerate(up_kernels)
    )
    emb_g = state.get("emb_g.weight")
    flow_layer1 = conv_attrs.get("flow.flows.0.enc.in_layers.1", {})
    if "resblock_dilation_sizes" in hparams:
        dilations = [tuple(int(d) for d in ds) for ds in hparams["resblock_dilation_sizes"]]
    elif not all(all(ds) for ds in dilations):
        dilations = [(1, 3, 5)] * n_kernels if resblock == "1" else list(VitsConfig().resblock_dilation_sizes)
    if "upsample_rates" in hparams:
        up_rates = tuple(int(u) for u in hparams["upsample_rates"])
    return VitsConfig(
        n_vocab=int(n_vocab),
        inter_channels=int(state["enc_p.proj.weight"].shape[0] // 2),
        hidden_channels=int(hidden),
        filter_channels=int(ffn.shape[0]),
        n_heads=int(hidden // rel_k.shape[2]),
        n_layers=_count(state, "enc_p.encoder.attn_layers.{}.conv_q.weight"),
        kernel_size=int(ffn.shape[2]),
        window_size=int((rel_k.shape[1] - 1) // 2),
        resblock=resblock,
        resblock_kernel_sizes=tuple(kernels),
        resblock_dilation_sizes=tuple(dilations),
        upsample_rates=up_rates,
        upsample_initial_channel=int(state["dec.conv_pre.weight"].shape[0]),
        upsample_kernel_sizes=up_kernels,
        n_speakers=int(emb_g.shape[0]) if emb_g is not None else 1,
        gin_channels=int(emb_g.shape[1]) if emb_g is not None else 0,
        flow_n_flows=sum(1 for k in state if re.fullmatch(r"flow\.flows\.\d+\.pre\.weight", k)),
        flow_n_layers=_count(state, "flow.flows.0.enc.in_layers.{}.bias"),
        flow_kernel_size=int(state["flow.flows.0.enc.in_layers.0.weight"].shape[2]),
        flow_dilation_rate=int(flow_layer1.get("dilations", [hparams.get("flow_dilation_rate", 1)])[0]),
        dp_filter_channels=int(state["dp.pre.weight"].shape[0]),
        dp_kernel_size=int(state["dp.convs.convs_sep.0.weight"].shape[2]),
        dp_n_flows=sum(1 for k in state if re.fullmatch(r"dp\.flows\.\d+\.pre\.weight", k)) + 1,
    )


# ---------------------------------------------------------------- checkpoints


def state_dict_from_checkpoint(path: str | Path) -> tuple[VitsConfig, dict[str, torch.Tensor]]:
    """Parameters (float32) and hyper-parameters of a Piper ``.ckpt`` or a ``save_checkpoint`` file."""
    try:
        ckpt = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:  # pickle / zip errors
        raise ModelError(f"cannot read checkpoint {path}: {exc}") from None
    if not isinstance(ckpt, Mapping):
        raise ModelError(f"checkpoint {path}: expected a dict, got {type(ckpt).__name__}")
    if "config" in ckpt and "state_dict" in ckpt:
        fields = {f.name for f in dataclasses.fields(VitsConfig)}
        cfg = {k: _tupled(v) for k, v in ckpt["config"].items() if k in fields}
        return VitsConfig(**cfg), {k: v.float() for k, v in ckpt["state_dict"].items()}
    raw = ckpt.get("state_dict", ckpt)
    prefix = "model_g." if any(k.startswith("model_g.") for k in raw) else ""
    state = {k[len(prefix) :]: v.float() for k, v in raw.items() if k.startswith(prefix)}
    state = _fold_weight_norm({k: v for k, v in state.items() if not k.startswith(_TRAINING_ONLY)})
    if "enc_p.emb.weight" not in state:
        raise ModelError(f"checkpoint {path}: no enc_p.emb.weight; not a Piper VITS generator")
    return _config_from_shapes(state, {}, ckpt.get("hyper_parameters") or {}), state


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, (list, tuple)) else value


def _fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weight = g * v / ||v||`` (norm over all but dim 0) for both weight-norm spellings."""
    spellings = ((".weight_g", ".weight_v"), (".parametrizations.weight.original0", ".parametrizations.weight.original1"))
    out = dict(state)
    for g_suffix, v_suffix in spellings:
        for key in [k for k in state if k.endswith(g_suffix)]:
            base = key[: -len(g_suffix)]
            g, v = out.pop(key), out.pop(base + v_suffix)
            norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
            out[base + ".weight"] = v * (g / norm)
    return out
