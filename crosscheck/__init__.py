"""Drive SGLang's and vLLM's own prefix caches over simlab's requests (see README.md)."""
