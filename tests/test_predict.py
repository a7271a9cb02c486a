"""``python -m simlab.predict``: the timed engine's cost model, asked for one prefill."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from simlab.config import ConfigError
from simlab.costmodel import CostModel
from simlab.predict import predict
from tests.fixtures import CONFIGS, ROOT


def config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="predict", overrides=overrides)


def test_the_prediction_is_the_timed_engines_prefill_time():
    cfg = config(["model=nemotron_h_8b", "engine.tp=2", "prefix=4000", "prefill=[500,5000]"])
    prediction = predict(cfg)
    from simlab.model import ModelSpec
    from simlab.simulate import build_engine

    cost: CostModel = build_engine(cfg).cost_model(ModelSpec.from_config(cfg.model))
    expected = [1000 * cost.prefill_time(4000, n) for n in (500, 5000)]
    assert prediction["prefill_ms"] == pytest.approx(expected, rel=1e-12)
    parts = prediction["breakdown_ms"]
    for i, total in enumerate(prediction["prefill_ms"]):
        assert sum(ms[i] for ms in parts.values()) == pytest.approx(total)
    assert prediction["prefill_ms"][0] < prediction["prefill_ms"][1]
    assert prediction["tp"] == 2 and prediction["calibration"].startswith("default efficiencies")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("prefill=[0]", "prefill: must be"),
        ("prefix=-1", "prefix: must be"),
        ("batch=0", "batch: must be"),
        ("engine=replay", "needs a timed engine"),
    ],
)
def test_bad_input_names_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        predict(config([override]))


def test_the_command_writes_prediction_json(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "simlab.predict",
            "prefill=[1000,2000]",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "prediction.json").read_text())
    assert saved["prefill_tokens"] == [1000, 2000] and len(saved["prefill_ms"]) == 2
    assert "prefill   1,000 tokens:" in proc.stdout
