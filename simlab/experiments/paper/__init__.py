"""``python -m simlab.paper``: the Marconi paper's published numbers beside simlab's.

Runs the paper's Figs. 7, 8, 10, 11, 12a, 12b, 13a and 13b (the ``configs/experiment/marconi_*``
sweeps; replay engine) twice: in *paper mode* (``policy.compat=reference``, the reference code's
semantics, and ``policy.tuning.protocol=paper``, its alpha tuner) and with simlab's *default
semantics* (``policy.compat=null``, the robust tuner). It writes ``paper.md`` and ``paper.pdf``:
for every number the paper publishes, the paper's value, simlab's in both modes, and whether the
direction of the paper's claim holds (Marconi above SGLang+, a ratio above 1, a trend's sign).

Layout of the output directory ``OUT``::

    OUT/paper.json                   the run's manifest (plan, modes, data, code version)
    OUT/sweeps/<mode>/<study>/       one Hydra multirun (joblib launcher) per study and mode
    OUT/logs/<mode>-<study>.log      that multirun's output
    OUT/paper.md, OUT/paper.pdf      the comparison, written last and atomically

Invariants:

* every study is a Hydra multirun with a fixed sweep directory, so a rerun resumes: points that
  finished are skipped (:mod:`simlab.run.sweep`), and a study that completed is not launched again
  (``paper_done.json`` in its sweep directory records what completed it);
* ``OUT`` holding another run (another plan, data directory, experiment file or code version)
  is refused with one line and exit status 2 unless ``--overwrite``;
* the same plan, data, code and seed give the same ``paper.md`` and ``paper.pdf`` bytes (nothing
  in them depends on the wall clock).

Where this checkout lacks ``policy.compat`` or ``policy.tuning.protocol``, both modes run without
it and ``paper.md`` says so (:class:`~simlab.experiments.paper.modes.Features`); without
``arrivals.gaps`` (the paper's trace construction) the run is refused.
"""

from simlab.experiments.paper.cli import main, run_main

__all__ = ["main", "run_main"]
