"""``bench.reference_speed`` end to end, with the independent model of the Marconi reference code
(``tests/marconi_reference_model.py``, equal to the real code on every fixture request) standing in
for the reference's ``radix_cache_hybrid.py``: the child process drives it through the same
``RadixCache`` interface, and the bench pairs its hits with simlab's request by request."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bench import reference_speed
from tests.test_compat import needs_data

STAND_IN = '''
"""The reference's RadixCache interface over tests/marconi_reference_model.py."""
from tests.marconi_reference_model import ReferenceTree

CREDIT = {credit}


class RadixCache:
    def __init__(self, num_ssm_layers, num_attn_layers, num_mlp_layers, d, n, capacity_bytes,
                 use_logical_ts, evict_policy_version, eff_weight, bootstrap_multiplier):
        self._tree = ReferenceTree(capacity_bytes, evict_policy_version, alpha=eff_weight,
                                   bugs=False, descent_bug=True)
        self.eff_weight = eff_weight
        self.request_history = []

    def match_prefix(self, key):
        _, hit, _ = self._tree.match_prefix(tuple(key))
        self.request_history.append((None, None, hit if CREDIT else 0))

    def insert(self, key, state_at_leaf=None, state_at_branchoff=None):
        self._tree.insert(tuple(key))
'''


def stand_in(folder: Path, credit: bool) -> Path:
    folder.mkdir()
    (folder / "radix_cache_hybrid.py").write_text(textwrap.dedent(STAND_IN.format(credit=credit)))
    return folder


def run_bench(tmp_path: Path, reference: Path) -> tuple[int, dict]:
    out = tmp_path / "speed.json"
    args = ["--reference-dir", str(reference), "--capacities", "1", "--repeat", "1"]
    status = reference_speed.main([*args, "--out", str(out)])
    return status, json.loads(out.read_text())


def test_hits_are_paired_request_by_request(tmp_path, capsys):
    needs_data("sharegpt")
    status, result = run_bench(tmp_path, stand_in(tmp_path / "ref", credit=True))
    assert status == 0
    (row,) = result["rows"]
    assert row["same_hits_every_request"]
    assert row["reference_token_hit_rate"] == pytest.approx(0.2225, abs=5e-5)  # the fixture's
    assert result["requests"] == 1235
    assert result["modes"] == reference_speed.simlab_modes()
    for mode in result["modes"]:
        ratio = row[f"simlab_{mode}_over_reference"]
        assert ratio == pytest.approx(
            row[f"simlab_{mode}_requests_per_s"] / row["reference_requests_per_s"]
        )
    assert "identical" in capsys.readouterr().out


def test_other_hits_fail_the_bench(tmp_path, capsys):
    needs_data("sharegpt")
    status, result = run_bench(tmp_path, stand_in(tmp_path / "ref", credit=False))
    assert status == 1
    assert not result["rows"][0]["same_hits_every_request"]
    assert "DIFFER" in capsys.readouterr().out


def test_without_a_reference_it_skips(monkeypatch, caplog):
    monkeypatch.delenv(reference_speed.REFERENCE_ENV, raising=False)
    assert reference_speed.main([]) == 0
    assert "reference speed skipped" in caplog.text


def test_a_folder_without_the_reference_is_named(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        reference_speed.main(["--reference-dir", str(tmp_path)])
