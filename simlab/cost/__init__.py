"""The cost model: time per batch from the model's shapes and the calibrated hardware.

``hardware`` (an accelerator's peaks), ``calibration`` (the op classes' efficiencies),
``profiles`` (measured op times per shape), ``terms`` (what the roofline misses), ``shapes``
(a batch, its ops and their classes), ``layers`` (the ops of each layer kind) and ``model``
(:class:`~simlab.cost.model.CostModel`, which times them)."""
