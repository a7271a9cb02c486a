"""The cost model: time per batch from the model's shapes and the calibrated hardware."""
