"""``python -m simlab.experiments.paper`` (also ``python -m simlab.paper``)."""

from simlab.experiments.paper.cli import run_main

if __name__ == "__main__":
    run_main()
