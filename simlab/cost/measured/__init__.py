"""Measured kernel times (NVIDIA's per-op latency tables in aiconfigurator-core): loading
(:mod:`.tables`), interpolation (:mod:`.interpolate`), the kernels of one GPU x backend x
version x dtype (:mod:`.kernels`), the op hooks (:mod:`.hooks`), the run's choice
(:mod:`.select`) and the time sources (:mod:`.sources`)."""
