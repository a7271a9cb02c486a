"""Calibration from Vidur's measured A100/H100 operator times (gpu_validate.vidur)."""

from __future__ import annotations

import json

import pytest

from gpu_validate.vidur import calibrate, main
from simlab.costmodel import Calibration
from traces.paths import resolve_data_dir

VIDUR = resolve_data_dir(None) / "vidur_profiling" / "compute" / "a100"
pytestmark = pytest.mark.skipif(not VIDUR.is_dir(), reason="Vidur profiles not in the data dir")


def test_a_fit_on_one_model_predicts_the_held_back_models(tmp_path):
    """Fit on Llama-2-7B, check on Llama-3-8B and Llama-2-70B. Today's figures (median / P90 of
    |error|): GEMMs 4.7% / 16.2%, norms and residuals 16.2% / 21.5%. The P90 target (10%) is not
    met: one efficiency per class misses the small-token GEMMs (see the issue's note)."""
    result = calibrate("a100", "a100_80gb", ["Llama-2-7b-hf"])
    assert result["fit"]["held_back"] == ["Llama-2-70b-hf", "Meta-Llama-3-8B"]
    assert result["held_back_error"]["gemm"]["median"] < 0.06
    assert result["held_back_error"]["elementwise"]["median"] < 0.2
    path = tmp_path / "a100.json"
    assert main(["--gpu", "a100", "--hardware", "a100_80gb", "--out", str(path)]) == 0
    loaded = Calibration.load(path)
    assert loaded.efficiency["gemm"].eta_c == pytest.approx(
        json.loads(path.read_text())["ops"]["gemm"]["eta_c"]
    )
    assert "attn_prefill" in json.loads(path.read_text())["unmeasured"]


def test_an_unknown_model_to_fit_on_is_an_error(tmp_path, capsys):
    assert main(["--fit", "Llama-9", "--out", str(tmp_path / "x.json")]) == 2
    assert "--fit ['Llama-9']" in capsys.readouterr().err
