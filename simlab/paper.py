"""``python -m simlab.paper``: the command line of :mod:`simlab.experiments.paper`, kept at its old path."""

import sys

from simlab.experiments import paper

sys.modules[__name__] = paper  # ``import simlab.paper`` is the module itself

if __name__ == "__main__":
    paper.run_main()
