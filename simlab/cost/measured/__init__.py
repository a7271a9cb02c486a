"""Measured kernel times (NVIDIA's per-op latency tables in aiconfigurator-core): loading
(:mod:`.tables`), interpolation (:mod:`.interpolate`, against the roofline of :mod:`.reference`),
the kernels of one GPU x backend x version x dtype (:mod:`.kernels`), the op hooks
(:mod:`.hooks`), the run's choice (:mod:`.select`), the time sources (:mod:`.sources`) and the
held-out check (:mod:`.heldout`, with the tables' own scatter: :mod:`.noise`)."""
