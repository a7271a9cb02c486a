"""The cost model's memoised and templated paths (what the timed engine calls) give exactly the
floats of the plain formulas: ``time`` against the sum of ``op_time`` over ``ops`` on fresh and
warm cost models, ``decode_span_of`` against the step-by-step affine evaluation of the first
two steps' ops; every model preset, TP 1/2/8, default and charged ``engine.costs``, an
uncalibrated and a calibrated (token-count curves) preset; ``==``, no tolerance
(``bench/costmodel_fastpath.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.costmodel_fastpath import (
    HARDWARE,
    TERMS,
    VARIANTS,
    check,
    load_hardware,
    model_specs,
)
from simlab.cost.model import CostModel
from simlab.cost.shapes import check_tp

SPECS = model_specs()


@pytest.mark.parametrize(("terms", "overlap"), VARIANTS, ids=["default", "charged", "overlap"])
@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("model", list(SPECS))
@pytest.mark.parametrize("preset", HARDWARE)
def test_fast_paths_are_the_plain_formulas_bit_for_bit(preset, model, tp, terms, overlap):
    hardware, calibration = load_hardware(preset)
    try:
        check_tp(SPECS[model], tp)
    except ValueError:
        pytest.skip(f"tp {tp} does not split {model}'s heads")

    def make() -> CostModel:
        return CostModel(SPECS[model], hardware, calibration, tp, TERMS[terms], overlap)

    variant = VARIANTS.index((terms, overlap))
    seed = [HARDWARE.index(preset), list(SPECS).index(model), tp, variant]
    assert check(make, 40, np.random.default_rng(seed)) is None


def test_a_template_slightly_off_is_caught(monkeypatch):
    """The check fails when the decode templates are off by one part in 10^12 (it can fail;
    one ulp of the ops before decode attention can vanish in the sum)."""
    hardware, calibration = load_hardware("h200")
    exact = CostModel._decode_template

    def slightly_off(self, n):
        template = exact(self, n)
        if template is None:
            return None
        head, var, tail, hidden = template
        return head * (1 + 1e-12), var, tail, hidden

    monkeypatch.setattr(CostModel, "_decode_template", slightly_off)

    def make() -> CostModel:
        return CostModel(SPECS["llama3_8b"], hardware, calibration, 1, TERMS["default"])

    problem = check(make, 40, np.random.default_rng(0))
    assert problem is not None and "decode_span" in problem
