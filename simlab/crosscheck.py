"""``python -m simlab.crosscheck``: the command line of :mod:`simlab.experiments.crosscheck`, kept at its old path."""

import sys

from simlab.experiments import crosscheck

sys.modules[__name__] = crosscheck  # ``import simlab.crosscheck`` is the module itself

if __name__ == "__main__":
    crosscheck.run_main()
