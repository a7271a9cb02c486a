"""Small helpers every layer may use: the paused garbage collector, numba without its BLAS probe, provenance."""
