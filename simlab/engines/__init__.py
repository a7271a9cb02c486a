"""Engines that drive the cache over a trace: the request step, replay, clusters, offline, the alpha tuner, the timed engine."""
