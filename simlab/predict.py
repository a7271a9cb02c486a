"""``python -m simlab.predict``: the command line of :mod:`simlab.experiments.predict`, kept at its old path."""

import sys

from simlab.experiments import predict

sys.modules[__name__] = predict  # ``import simlab.predict`` is the module itself

if __name__ == "__main__":
    predict.run_main()
