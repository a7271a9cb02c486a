"""``python -m simlab.crosscheck_load``: the command line of :mod:`simlab.experiments.crosscheck_load`, kept at its old path."""

import sys

from simlab.experiments import crosscheck_load

sys.modules[__name__] = crosscheck_load  # ``import simlab.crosscheck_load`` is the module itself

if __name__ == "__main__":
    crosscheck_load.run_main()
