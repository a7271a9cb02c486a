"""The timed engine: a SimPy world of batches, its jobs, the shared KV pool and vLLM's world."""
