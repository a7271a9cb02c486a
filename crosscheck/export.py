"""Export simlab's tokenized request sequence for the engine drivers (run with simlab's venv).

    .venv/bin/python -m crosscheck.export --out .crosscheck/sharegpt.npz trace=sharegpt model=llama3_8b

Composes simlab's Hydra config from ``OVERRIDES`` exactly as ``python -m simlab`` does, loads the
trace with its arrival times (:func:`simlab.run.simulate.load_trace`) and writes the requests in
simlab's replay order (:meth:`traces.format.Trace.requests`) to one ``.npz``:

* ``request_id``, ``input_len``, ``output_len``: one row per request, in replay order;
* ``input_ids`` / ``output_ids``: all requests' tokens concatenated, sliced by
  ``input_offsets`` / ``output_offsets`` (``len + 1`` entries each);
* ``overrides``, ``model``, ``kv_bytes_per_token``, ``ssm_state_bytes``: what was exported.

A hash-id trace (Mooncake: one id per 512-token block, ``trace.block_size`` tokens per id) has no
tokens, so each id stands for ``block_size`` copies of itself and a prompt is cut at its true
length (``input_tokens``: the last id's block is usually partial). Distinct ids give distinct
blocks, equal id chains equal prefixes, so an engine's block hashes match exactly where the ids
do. Its replies are unknown and simlab admits none of them: each request exports one output
token (``-1``, sampled and never fed back), so the engine caches no output block either. With
``--outputs trace`` it exports the trace's output length instead, every token ``-1``, for the
drivers under load, where decode steps hold memory (a full block of them is cached, and no
prompt ever matches it).

The drivers (``crosscheck.sglang_radix`` and friends) read this file with NumPy only, so they
never import simlab, and this module never imports torch or an engine.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from simlab import ModelSpec
from simlab.config import run_settings
from simlab.run.plan import trace_spec
from simlab.run.simulate import load_trace
from traces.format import Request

log = logging.getLogger(__name__)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def export(overrides: list[str], out: Path, replies: str = "one") -> int:
    """Write the replay-order requests of the config composed from ``overrides`` to ``out``;
    returns the number of requests. ``replies``: a hash-id trace's output tokens, ``one`` or
    the ``trace``'s length (module docstring)."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    model = ModelSpec.from_config(cfg.model)
    trace = load_trace(trace_spec(cfg), run_settings(cfg))
    requests = list(trace.requests())
    if trace.block_size == 1:
        for r in requests:
            if r.output_ids.shape[0] != r.output_len:
                raise ValueError(f"request {r.request_id}: output tokens unknown")
        inputs = [r.input_ids for r in requests]
        outputs = [r.output_ids for r in requests]
    else:
        inputs = [hash_id_tokens(r) for r in requests]
        outputs = [np.full(reply_len(r, replies), -1, dtype=np.int64) for r in requests]
    input_lens = np.array([len(x) for x in inputs], dtype=np.int64)
    output_lens = np.array([len(x) for x in outputs], dtype=np.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        request_id=np.array([r.request_id for r in requests], dtype=np.int64),
        input_len=input_lens,
        output_len=output_lens,
        input_ids=np.concatenate(inputs).astype(np.int64),
        output_ids=np.concatenate(outputs).astype(np.int64),
        input_offsets=np.concatenate(([0], np.cumsum(input_lens))),
        output_offsets=np.concatenate(([0], np.cumsum(output_lens))),
        overrides=np.array(overrides),
        model=np.array(model.name),
        kv_bytes_per_token=np.array(model.kv_bytes_per_token),
        ssm_state_bytes=np.array(model.ssm_state_bytes),
    )
    return len(requests)


def hash_id_tokens(req: Request) -> np.ndarray:
    """A hash-id request's prompt as tokens: each id repeated ``block_size`` times, cut at its
    true length (module docstring)."""
    tokens = np.repeat(req.input_ids.astype(np.int64), req.block_size)
    return tokens[: req.input_tokens]


def reply_len(req: Request, replies: str) -> int:
    """Output tokens a hash-id request exports (``replies``: ``one`` or ``trace``)."""
    if replies == "trace":
        return max(int(req.output_len), 1)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crosscheck.export", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the .npz to write")
    parser.add_argument(
        "--outputs",
        choices=("one", "trace"),
        default="one",
        help="a hash-id trace's output tokens (all -1): one, or the trace's output length",
    )
    parser.add_argument("overrides", nargs="*", help="simlab Hydra overrides")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    n = export(args.overrides, args.out, args.outputs)
    print(f"{args.out}: {n} requests ({' '.join(args.overrides)})")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
