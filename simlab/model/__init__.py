"""A model's architecture: layer kinds, bytes per token and per state (:mod:`simlab.model.spec`)."""
