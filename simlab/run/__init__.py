"""One run from a config: the plan, simulate, capacity lists, sweeps, summaries."""
