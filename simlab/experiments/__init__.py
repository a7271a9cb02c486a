"""Studies built on runs: the Marconi paper, prefill predictions, measured tables, the engine cross-checks."""
