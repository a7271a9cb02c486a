"""Per-request hits of the Marconi reference code, driven over simlab's request sequences.

    .venv/bin/python -m crosscheck.marconi_reference --reference-dir /path/to/marconi \
        [--reference-python python3] [--out tests/fixtures/marconi_reference] [--check]

``--reference-dir`` is a directory holding the reference's ``radix_cache_hybrid.py`` (a checkout
of github ``ruipeterpan/marconi`` or a fork of it). That code is CC BY-NC: it is never copied
into this repository; this file only drives it. The fixtures in
``tests/fixtures/marconi_reference/`` were made from the fork ``meghrathod/marconi`` (commit
``504cf230``; see their ``manifest.json``).

Two processes:

* the parent (simlab's venv) exports simlab's request sequence of each trace, in replay order
  (``tests.fixtures.compose`` + ``simlab.run.simulate.load_trace``), to JSON lines in a temporary
  directory, then runs this same file with ``--child`` under ``--reference-python``;
* the child never imports simlab. It writes small stand-ins for the modules the reference
  imports besides itself (:data:`SHIMS`, placed before ``--reference-dir`` on ``sys.path`` so a
  checkout's own ``utils`` is not used unless ``--own-modules``), then replays each case the way
  the reference's ``policy_exploration.py`` does: ``match_prefix(input)``, the hit is the
  ``tokens reused`` of the last ``request_history`` entry, then
  ``insert(input + output, state_at_leaf=session, state_at_branchoff=session)``.

Alpha tuning is off: ``bootstrap_multiplier=10**12``, so ``len(request_history)`` never equals
``bootstrap_window_size`` (the multiplier times the requests seen before the first eviction)
and ``tune_config`` is never called; ``eff_weight`` stays the case's alpha (checked at the end).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import csv
import hashlib
import importlib
import inspect
import io
import json
import logging
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("crosscheck.marconi_reference")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "marconi_reference"
COLUMNS = ("position", "request_id", "reference_hit")
TRACES = {"sharegpt": ["trace=sharegpt"], "swebench": ["trace=swebench", "trace.limit=10"]}
#: (trace, cache GB, label, evict_policy_version, eff_weight)
CASES = [
    (trace, gb, label, version, alpha)
    for trace, sizes in (("sharegpt", (1, 2)), ("swebench", (4, 8)))
    for gb in sizes
    for label, version, alpha in (
        ("marconi_alpha0", 2, 0.0),
        ("marconi_alpha1", 2, 1.0),
        ("sglang_plus", 1, 0.0),
    )
] + [("swebench", 2, "sglang_plus", 1, 0.0)]  # equal access times: the heap's tie order counts
#: What the fixtures' manifest records about the source the committed files were made from.
SOURCE = {
    "repo": "meghrathod/marconi",
    "commit": "504cf230c75bcbde999ee62786bd8473ce29e0fd",
    "file": "radix_cache_hybrid.py",
    "upstream": "ruipeterpan/marconi (CC BY-NC; not vendored here)",
    "fork_vs_notes": "the fork's evict_v2 fixes two bugs the notes describe for upstream HEAD "
    "0801661: the MLP term subtracts mlp_flops(parent) (notes: attn_flops, l. 526) and a deleted "
    "leaf counts its own KV (node_to_evict; notes: the stale loop variable node, l. 555); the "
    "descent bug (l. 360-362) is kept",
}

#: Stand-ins for the modules ``radix_cache_hybrid.py`` imports besides the standard library,
#: written from ``../shared/notes/marconi_reference.md`` (sections 1.2, 2, 7) and the paper's
#: FLOP formulas (the NVIDIA 7B hybrid: d 4096, state dim 128, FP16).
SHIMS = {
    "utils.py": '''"""Stand-in for the reference's utils (sizes in bytes, FLOPs per layer, Python ints)."""

SSM_STATE_BYTES_MODEL = 26_787_840  # all 24 SSM layers of the 7B hybrid


def get_mamba_state_size(d, n):
    return SSM_STATE_BYTES_MODEL // 24  # one SSM layer


def get_kvs_size(num_tokens, d):
    return num_tokens * 2 * d * 2  # K and V, FP16, one attention layer


def get_attn_flops(l, d):
    return 8 * l * d * d + 4 * l * l * d


def get_mlp_flops(l, d):
    return 16 * l * d * d


def get_mamba1_flops(l, d, n):
    return 12 * l * d * d + 16 * l * d * n + 10 * l * d


def get_model_state_size(*args, **kwargs):
    raise NotImplementedError("not used by the replay")


def get_flops_efficiency(*args, **kwargs):
    raise NotImplementedError("not used by the replay")


def _key_match(key0, key1):
    i = 0
    for a, b in zip(key0, key1):
        if a != b:
            break
        i += 1
    return i


def _normalize(values):
    values = list(values)
    if len(values) <= 1 or min(values) == max(values):
        return [1.0] * len(values)
    lo, hi = min(values), max(values)
    return [(v - lo) / (hi - lo) for v in values]
''',
    "config_tuner.py": '''"""Stand-in for the reference's config_tuner: tuning must not run in these replays."""


class ConfigTuner:
    def __init__(self, *args, **kwargs):
        self.tree_snapshot = None

    def tune_config(self, *args, **kwargs):
        raise RuntimeError("alpha tuning must not run (bootstrap_multiplier is 10**12)")
''',
    "transformers.py": '''"""Stand-in: radix_cache_hybrid.py imports these names and never uses them."""
AutoTokenizer = None
AutoModelForCausalLM = None
''',
}
#: Used only when the reference's interpreter has no scipy (``rankdata`` is imported, unused).
SCIPY_STUB = {
    "scipy/__init__.py": "",
    "scipy/stats.py": "def rankdata(*args, **kwargs):\n    raise NotImplementedError\n",
}


def case_name(trace: str, gb: int, label: str) -> str:
    return f"{trace}_{gb}gb_{label}"


# ---------------------------------------------------------------------------- child (no simlab)
def write_shims(folder: Path) -> None:
    files = dict(SHIMS)
    try:
        importlib.import_module("scipy.stats")
    except ImportError:
        files |= SCIPY_STUB
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def replay(module, requests: list[dict], version: int, alpha: float, capacity: float) -> list[int]:
    """Per-request hits of the reference's ``RadixCache`` over ``requests`` (the exported rows),
    replayed as its ``policy_exploration.py`` does, alpha tuning off."""
    params = inspect.signature(module.RadixCache).parameters
    wanted = {
        "num_ssm_layers": 24,
        "num_attn_layers": 4,
        "num_mlp_layers": 28,
        "d": 4096,
        "n": 128,
        "capacity_bytes": capacity,
        "use_logical_ts": True,
        "evict_policy_version": version,
        "eff_weight": alpha,
        "bootstrap_multiplier": 10**12,
    }
    missing = sorted(set(wanted) - set(params))
    if missing:
        raise SystemExit(f"RadixCache has no parameter(s) {missing}: not the expected reference")
    tree = module.RadixCache(**wanted)
    hits = []
    with contextlib.redirect_stdout(io.StringIO()):  # it prints at its first eviction
        for r in requests:
            tree.match_prefix(r["input_tokens"])
            hits.append(int(tree.request_history[-1][2]))
            tree.insert(
                r["input_tokens"] + r["output_tokens"],
                state_at_leaf=r["session_id"],
                state_at_branchoff=r["session_id"],
            )
    if tree.eff_weight != alpha:
        raise SystemExit(f"eff_weight changed to {tree.eff_weight}: tuning ran")
    return hits


def import_reference(reference_dir: str, own_modules: bool = False):
    """The reference's ``radix_cache_hybrid`` module, with :data:`SHIMS` for what it imports
    (the checkout's own modules instead with ``own_modules``)."""
    shim_dir = Path(tempfile.mkdtemp(prefix="marconi_shims_"))
    atexit.register(shutil.rmtree, shim_dir, ignore_errors=True)
    write_shims(shim_dir)
    ref = str(Path(reference_dir).resolve())
    sys.path[:0] = [ref] if own_modules else [str(shim_dir), ref]
    return importlib.import_module("radix_cache_hybrid")


def run_with_deep_stack(work: Callable[[], None]) -> None:
    """``work()`` in a thread with a 512 MiB stack and a high recursion limit (the reference
    recurses once per node on a path); its exception is re-raised here."""
    sys.setrecursionlimit(200_000)
    threading.stack_size(512 * 1024 * 1024)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the calling thread)
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if errors:
        raise errors[0]


def child(args: argparse.Namespace) -> None:
    module = import_reference(args.reference_dir, args.own_modules)
    exports = Path(args.exports)
    results = {}
    for trace, gb, label, version, alpha in CASES:
        name = case_name(trace, gb, label)
        if args.cases and name not in args.cases:
            continue
        with (exports / f"{trace}.jsonl").open() as f:
            requests = [json.loads(line) for line in f]
        results[name] = replay(module, requests, version, alpha, gb * 1e9)
        log.info("%s: replayed %d requests", name, len(requests))
    (exports / "hits.json").write_text(json.dumps(results))


# ---------------------------------------------------------------------------- parent (simlab)
def export_requests(folder: Path, traces: set[str]) -> dict[str, list[dict]]:
    """Each trace's request sequence in simlab's replay order, to ``folder/<trace>.jsonl``."""
    sys.path.insert(0, str(ROOT))
    from simlab.config import run_settings
    from simlab.run.plan import trace_spec
    from simlab.run.simulate import load_trace
    from tests.fixtures import compose

    out = {}
    for trace in sorted(traces):
        cfg = compose(TRACES[trace])
        reqs = list(load_trace(trace_spec(cfg), run_settings(cfg)).requests())
        rows = [
            {
                "position": i,
                "request_id": int(r.request_id),
                "session_id": int(r.session_id),
                "input_tokens": [int(x) for x in r.input_ids],
                "output_tokens": [int(x) for x in r.output_ids],
            }
            for i, r in enumerate(reqs)
        ]
        with (folder / f"{trace}.jsonl").open("w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        out[trace] = rows
    return out


def _write_case(path: Path, rows: list[dict], hits: list[int]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(
            (r["position"], r["request_id"], h) for r, h in zip(rows, hits, strict=True)
        )


def _read_case(path: Path) -> list[int]:
    with path.open() as f:
        return [int(row["reference_hit"]) for row in csv.DictReader(f)]


def _manifest(args: argparse.Namespace, ref_file: Path, rates: dict[str, float]) -> dict:
    return {
        "source": SOURCE | {"sha256": hashlib.sha256(ref_file.read_bytes()).hexdigest()},
        "what": "per-request reusable tokens credited by the reference's match_prefix, in simlab's "
        "replay order (column reference_hit); input then input+output inserted per request",
        "constructor": "RadixCache(num_ssm_layers=24, num_attn_layers=4, num_mlp_layers=28, "
        "d=4096, n=128, capacity_bytes=GB*1e9, use_logical_ts=True, evict_policy_version=V, "
        "eff_weight=ALPHA, bootstrap_multiplier=10**12)",
        "tuning": "off: bootstrap_multiplier=10**12, so len(request_history) never equals "
        "bootstrap_window_size and tune_config is never called; eff_weight stays ALPHA",
        "shims": {
            "utils": "get_mamba_state_size(d, n) = 26,787,840 // 24 B (one SSM layer); "
            "get_kvs_size(t, d) = t*2*d*2 B (K+V, FP16, one attention layer); "
            "get_attn_flops(l, d) = 8 l d^2 + 4 l^2 d; get_mlp_flops(l, d) = 16 l d^2; "
            "get_mamba1_flops(l, d, n) = 12 l d^2 + 16 l d n + 10 l d (Python ints); "
            "_key_match = length of the common prefix; _normalize = min-max, all 1.0 when "
            "there is at most one value or min == max; get_model_state_size and "
            "get_flops_efficiency raise (unused)",
            "config_tuner": "ConfigTuner with tree_snapshot = None; tune_config raises",
            "transformers": "AutoTokenizer = AutoModelForCausalLM = None (imported, unused)",
            "scipy": "stats.rankdata stub, only if the interpreter has no scipy (imported, unused)",
        },
        "cases": {
            case_name(t, gb, label): {
                "trace_overrides": TRACES[t],
                "capacity_bytes": gb * 1e9,
                "evict_policy_version": version,
                "eff_weight": alpha,
                "token_hit_rate": rates.get(case_name(t, gb, label)),
            }
            for t, gb, label, version, alpha in CASES
        },
        "simlab_equivalent": "these hits equal simlab's with policy.compat=reference_fixed "
        "+policy.semantics.partial_descent=true (the fork fixes the MLP-term and freed-bytes "
        "bugs and keeps the descent bug); policy.compat=reference matches the fork only with "
        "those two lines restored to the bugs",
        "command": "python -m crosscheck.marconi_reference " + shlex.join(args.argv),
    }


def parent(args: argparse.Namespace) -> int:
    ref_file = Path(args.reference_dir) / "radix_cache_hybrid.py"
    if not ref_file.is_file():
        raise SystemExit(f"no radix_cache_hybrid.py in {args.reference_dir}")
    names = {case_name(t, gb, label) for t, gb, label, _, _ in CASES}
    unknown = sorted(set(args.cases or ()) - names)
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {sorted(names)}")
    wanted = [c for c in CASES if not args.cases or case_name(*c[:3]) in args.cases]
    with tempfile.TemporaryDirectory(prefix="marconi_ref_") as tmp:
        folder = Path(tmp)
        rows = export_requests(folder, {c[0] for c in wanted})
        cmd = [args.reference_python, str(Path(__file__).resolve()), "--child", "--exports", tmp]
        cmd += ["--reference-dir", str(Path(args.reference_dir).resolve())]
        cmd += ["--own-modules"] if args.own_modules else []
        cmd += ["--cases", *args.cases] if args.cases else []
        subprocess.run(cmd, check=True)
        hits = json.loads((folder / "hits.json").read_text())
    out = Path(args.out)
    differing = 0
    rates = {}
    for trace, gb, label, _, _ in wanted:
        name = case_name(trace, gb, label)
        case_rows, case_hits = rows[trace], hits[name]
        total = sum(len(r["input_tokens"]) for r in case_rows)
        rates[name] = round(sum(case_hits) / total, 6)
        log.info("%s: token hit rate %.4f%%", name, 100 * rates[name])
        if args.check:
            old = _read_case(out / f"{name}.csv")
            same = sum(a == b for a, b in zip(old, case_hits, strict=True))
            differing += same != len(old)
            log.info("%s: %d/%d requests as in the fixture", name, same, len(old))
        else:
            out.mkdir(parents=True, exist_ok=True)
            _write_case(out / f"{name}.csv", case_rows, case_hits)
    if not args.check:
        kept = out / "manifest.json"  # cases not re-run keep their recorded rates
        if kept.is_file():
            cases = json.loads(kept.read_text()).get("cases", {})
            rates = {k: v["token_hit_rate"] for k, v in cases.items()} | rates
        manifest = _manifest(args, ref_file, rates)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-dir", required=True, help="holds radix_cache_hybrid.py")
    p.add_argument("--reference-python", default=sys.executable, help="interpreter for it")
    p.add_argument("--out", default=str(FIXTURES), help="fixture directory")
    p.add_argument("--cases", nargs="*", help="case names (default: all)")
    p.add_argument("--check", action="store_true", help="compare with the fixtures, write nothing")
    p.add_argument("--own-modules", action="store_true", help="the checkout's utils, not shims")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--exports", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.child:
        run_with_deep_stack(lambda: child(args))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
