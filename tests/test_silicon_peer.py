"""``python -m bench.silicon_peer``: aiconfigurator-core's own estimator on the silicon points
simlab validates against, estimated as aiconfigurator's comparison estimates them, failures
counted by reason, written atomically."""

from __future__ import annotations

import json

import pytest

from bench import silicon_peer
from simlab.cost.measured import tables
from simlab.experiments.silicon import points

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def test_the_peer_estimates_the_same_points_and_counts_what_it_cannot(tmp_path):
    root = tables.systems_dir()
    assert root is not None
    pts, _ = points(root / "silicon_sample.csv")
    qwen = [
        p for p in pts if "Qwen3.5" in p.model
    ]  # points its tables have (MiniMax's on B300 not)
    assert silicon_peer.main(["--out", str(tmp_path), "--model", "Qwen3.5", "--limit", "3"]) == 0
    result = json.loads((tmp_path / "silicon_peer.json").read_text())
    assert [r["id"] for r in result["rows"]] == [p.id for p in qwen[:3]]
    for row in result["rows"]:
        got = row["primary"]
        assert got["isl"] == row["isl"] and got["ctx_tokens"] == row["isl"]  # cli_estimate's
        assert got["ttft_ms"] > 0 and got["tpot_ms"] > 0
    primary = result["primary"]
    assert primary["estimated"] + primary["failed"] == primary["points"] == 3
    errors = [abs(r["primary"]["ttft_ms"] / r["ttft_ms"] - 1) for r in result["rows"]]
    assert primary["ttft_mape"] == pytest.approx(sum(errors) / 3)
    assert not list(tmp_path.glob(".silicon_peer.*"))  # no temporary file left


def test_a_version_aiconfigurator_does_not_query_takes_the_closest_slot_above():
    root = tables.systems_dir()
    assert root is not None
    pts, _ = points(root / "silicon_sample.csv")
    old = next(p for p in pts if p.backend == "sglang" and p.version == "0.5.9")
    assert silicon_peer.slot_version(old) == "0.5.14"


def test_simlabs_errors_are_taken_on_the_points_the_peer_estimated_only(tmp_path, capsys):
    """``--validation``: simlab's held-out and in-sample errors on each variant's estimated
    points, joined by id; a point the peer failed on does not count."""
    root = tables.systems_dir()
    assert root is not None
    pts, _ = points(root / "silicon_sample.csv")
    rows = [
        {"id": p.id, "ttft_ms": 100.0, "tpot_ms": 10.0, "ttft_ms_held_out": 100.0 + 10 * i,
         "tpot_ms_held_out": 10.0, "ttft_ms_in_sample": 100.0, "tpot_ms_in_sample": 12.0}
        for i, p in enumerate([p for p in pts if "Qwen3.5" in p.model][:3])
    ]  # fmt: skip
    validation = tmp_path / "validation.json"
    validation.write_text(json.dumps({"rows": rows}))
    assert silicon_peer.main(["--out", str(tmp_path), "--model", "Qwen3.5", "--limit", "3", "--validation", str(validation)]) == 0  # fmt: skip
    result = json.loads((tmp_path / "silicon_peer.json").read_text())
    estimated = [i for i, r in enumerate(result["rows"]) if "error" not in r["primary"]]
    assert estimated  # the check needs a point the peer estimated
    ours = result["simlab_on_same_points"]["primary"]["overall"]
    assert ours["points"] == len(estimated)
    assert ours["ttft_mape_held_out"] == pytest.approx(
        sum(0.1 * i for i in estimated) / len(estimated)
    )
    assert ours["tpot_mape_in_sample"] == pytest.approx(0.2)
    assert "simlab on primary's overall" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        silicon_peer.main(["--out", str(tmp_path), "--validation", str(tmp_path / "none.json")])
