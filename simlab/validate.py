"""``python -m simlab.validate silicon --out DIR``: the command line of
:mod:`simlab.experiments.silicon_run`."""

import sys

from simlab.experiments import silicon_run

if __name__ == "__main__":
    sys.exit(silicon_run.main())
