#!/usr/bin/env bash
# The GPU calibration in one call of a bare GPU machine with no network (README "Running on a
# fresh GPU machine"), from the repository root:
#
#     OUT=/some/dir bash gpu_validate/device.sh
#
# installs the carried wheels (fla-core, einops) into /tmp/site, measures for BUDGET seconds
# (default 360), fits and reports, then runs the GPU tests, and leaves eight files in OUT:
#   pytest.log, run/records.jsonl, calibration.json,
#   report/{report.md, summary.json, predictions.csv, pred_vs_meas.png, stack_prefill.csv}.
# Needs only what the GPU image has (torch, triton, numpy, scipy, matplotlib, pyyaml): no Hydra,
# no install of simlab. Rehearse it on a CPU with DEVICE=cpu TINY=1 BUDGET=40.
# Afterwards, on any machine: commit run/records.jsonl as gpu_validate/records/<gpu>_<date>.jsonl
# and calibration.json as gpu_validate/calibration/<preset>.json, and check the composed stack
# against simlab.experiments.predict with report/stack_prefill.csv (gpu_validate/README.md, "Fit and report").
set -euo pipefail
: "${OUT:?set OUT to the directory the results go to}"
budget=${BUDGET:-360}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
site=${SITE:-/tmp/site}

mkdir -p "$OUT"
"$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" gpu_validate/wheels/*.whl
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the measurements first: each record is on disk (fsync) as soon as it is taken, so a command
# cut off at its limit still returns run/records.jsonl, and fit and report run anywhere
"$python" -m gpu_validate --budget "$budget" --out "$OUT/run" --device "$device" ${TINY:+--tiny}
"$python" -m gpu_validate fit "$OUT/run" --out "$OUT/calibration.json"
"$python" -m gpu_validate report "$OUT/run" --calibration "$OUT/calibration.json" --out "$OUT/report"
if [ "$device" != cpu ]; then  # fla against the reference, a tiny run on the GPU
    "$python" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_validate.py \
        >"$OUT/pytest.log" 2>&1 || echo "device.sh: GPU tests failed, see pytest.log" >&2
fi
