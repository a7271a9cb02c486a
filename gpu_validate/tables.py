"""``python -m gpu_validate tables RECORDS --gpu GPU --backend B --version V --out DIR``: a run's
measured ops as per-op latency tables in aiconfigurator-core's layout, which simlab reads
beside the package's (``engine.kernel_tables=DIR``, :mod:`simlab.cost.measured`).

``DIR/<gpu>/<family>/<backend>/<version>/<table>.parquet`` (latency in ms, one layer), with a
``collection_meta.yaml`` naming the run. Each table keeps the package's columns, so simlab
queries a table written here exactly as the package's:

* ``gemm/gemm_perf``: the single-GEMM ops (QKV and output projections, the SSM projections,
  the LM head) at ``m`` = tokens, ``n, k`` of the op (the MLP and MoE, two or more GEMMs each,
  stay out);
* ``attention/context_attention_perf``: prefills without a cached prefix (``isl`` = new
  tokens); ``attention/generation_attention_perf``: decode steps (``step`` = context - 1);
* ``ssm/mamba2_scan_perf``: the Mamba2 layer's conv1d and SSD chunked scan of one prefill,
  from an empty state (``seq_len`` = tokens), and ``ssm/mamba2_step_perf``: its recurrent
  decode step -- the scans no public table measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from gpu_validate.records import headers, read_records, timed
from simlab.model.spec import ModelSpec

#: the columns every attention row shares (BF16 activations and KV cache, full attention)
ATTENTION = {
    "attn_dtype": "bfloat16",
    "kv_cache_dtype": "bfloat16",
    "window_size": 0,
    "beam_width": 1,
}
KERNEL = "gpu_validate"
#: the suites whose plain op records fit a table
SUITES = ("gemm", "attn", "ssm")


def gemm_shape(spec: ModelSpec, name: str) -> tuple[int, int] | None:
    """``(n, k)`` of a single-GEMM op of ``spec`` (None: not one GEMM)."""
    d, qdim, kvdim = spec.d_model, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    in_dim = 2 * spec.ssm_d_inner + 2 * spec.ssm_n_groups * spec.ssm_state_dim + spec.ssm_n_heads
    shapes = {
        "attn_qkv_proj": (qdim + 2 * kvdim, d),
        "attn_out_proj": (d, qdim),
        "ssm_in_proj": (in_dim, d),
        "ssm_out_proj": (d, spec.ssm_d_inner),
        "lm_head": (spec.vocab_size, d),
    }
    return shapes.get(name)


def row(record: dict[str, Any], spec: ModelSpec) -> tuple[str, dict[str, Any]] | None:
    """The table and row of one op record (None: no table holds that op)."""
    if record.get("variant") or record.get("suite") not in SUITES:
        return None  # a prefix, an initial state, shared-context attention: no table's shape
    p, name = record["params"], record["op_name"]
    shape = gemm_shape(spec, name)
    if shape is not None:
        found: tuple[str, dict[str, Any]] | None = (
            "gemm_perf",
            {"gemm_dtype": "bfloat16", "m": p["tokens"], "n": shape[0], "k": shape[1]},
        )
    else:
        found = _shaped_row(name, p, spec)
    return None if found is None else (found[0], found[1] | {"latency": 1e3 * record["median_s"]})


def _shaped_row(name: str, p: dict[str, Any], spec: ModelSpec) -> tuple[str, dict[str, Any]] | None:
    """The attention and Mamba2 rows (their table and shape columns)."""
    heads: dict[str, Any] = {"num_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads}
    heads |= {"head_dim": spec.head_dim, **ATTENTION}
    ssm: dict[str, Any] = {"nheads": spec.ssm_n_heads, "head_dim": spec.ssm_head_dim}
    ssm |= {"d_state": spec.ssm_state_dim, "n_groups": spec.ssm_n_groups}
    if name == "attn_prefill":
        shape = {"batch_size": p["batch"], "isl": p["new"], "step": 0, **heads}
        return "context_attention_perf", shape
    if name == "attn_decode":
        shape = {"batch_size": p["batch"], "isl": 1, "step": p["ctx"] - 1, **heads}
        return "generation_attention_perf", shape
    if name == "ssm_scan":
        return "mamba2_scan_perf", {"batch_size": p["batch"], "seq_len": p["tokens"], **ssm}
    if name == "ssm_step":
        return "mamba2_step_perf", {"batch_size": p["batch"], **ssm}
    return None


FAMILY = {
    "gemm_perf": "gemm",
    "context_attention_perf": "attention",
    "generation_attention_perf": "attention",
    "mamba2_scan_perf": "ssm",
    "mamba2_step_perf": "ssm",
}


def tables_of(records: list[dict[str, Any]]) -> dict[str, pd.DataFrame]:
    """Each table's rows from the op records (the model of each run from its header)."""
    specs = {h["run_id"]: ModelSpec.from_config(h["model"]) for h in headers(records)}
    rows: dict[str, list[dict[str, Any]]] = {}
    for record in timed(records):
        spec = specs.get(record.get("run_id"))
        found = None if spec is None else row(record, spec)
        if found is not None:
            rows.setdefault(found[0], []).append(found[1] | {"kernel_source": KERNEL})
    return {table: pd.DataFrame(r) for table, r in rows.items()}


def write_tables(
    paths: list[str], out: str | Path, gpu: str, backend: str, version: str
) -> list[Path]:
    """Write the tables of the records at ``paths`` under ``out``; the files written."""
    written = []
    for table, frame in sorted(tables_of(read_records(paths)).items()):
        folder = Path(out) / gpu / FAMILY[table] / backend / version
        folder.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(folder / f"{table}.parquet", index=False)
        meta = {
            "schema_version": 1,
            "provenance": "gpu_validate",
            "runtime": {"framework": backend, "version": version},
        }
        (folder / "collection_meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
        written.append(folder / f"{table}.parquet")
    return written
