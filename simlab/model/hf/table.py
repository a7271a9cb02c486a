"""The bundled configs as a table: layer kinds, KV bytes per token, state bytes per request."""

from __future__ import annotations

import logging

from simlab.model.hf import ARCHITECTURES, model_spec
from simlab.model.hf.resolve import bundled_ids, find_config, read_config
from simlab.model.spec import ModelSpec

log = logging.getLogger(__name__)

HEADER = [
    "model",
    "architecture",
    "layers",
    "KV bytes/token",
    "state bytes/request",
    "state dtypes",
]


def layer_kinds(m: ModelSpec) -> str:
    """``15 attn (gated) + 45 gdn; 60 moe (+shared)``-style summary of the layer mix."""
    attn = f"{m.n_attn_layers} {m.attn_kind}"
    if m.n_swa_layers:
        attn += f" ({m.n_swa_layers} sliding, window {m.swa_window})"
    if m.attn_gate:
        attn += " (gated)"
    mixers = [attn] if m.n_attn_layers else []
    if m.n_ssm_layers:
        mixers.append(f"{m.n_ssm_layers} {m.ssm_kind}")
    ffn = [f"{m.n_mlp_layers} mlp"] if m.n_mlp_layers else []
    if m.n_moe_layers:
        shared = " +shared" if m.moe_shared_intermediate else ""
        ffn.append(f"{m.n_moe_layers} moe {m.moe_top_k}/{m.moe_experts}{shared}")
    return " + ".join(mixers) + "; " + " + ".join(ffn)


def rows(hybrids_only: bool) -> list[list[str]]:
    """One row per bundled config of a supported architecture (hybrids only if asked)."""
    out = []
    for model_id in bundled_ids():
        arch = read_config(find_config(model_id)).get("architectures", ["?"])[0]
        if arch not in ARCHITECTURES:
            continue
        m = model_spec(model_id)
        if hybrids_only and not m.is_hybrid:
            continue
        state = f"{m.ssm_state_bytes:,}" if m.is_hybrid else "-"
        dtypes = m.state_dtypes.replace("|", "/")
        out.append([model_id, arch, layer_kinds(m), f"{m.kv_bytes_per_token:,}", state, dtypes])
    return out


def markdown(hybrids_only: bool = True) -> str:
    """The table in Markdown."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(hybrids_only)]
    return "\n".join(lines) + "\n"
