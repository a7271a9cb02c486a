"""``python -m simlab.validate silicon --out DIR``: the command line of
:mod:`simlab.experiments.silicon`."""

import sys

from simlab.experiments import silicon

if __name__ == "__main__":
    sys.exit(silicon.main())
