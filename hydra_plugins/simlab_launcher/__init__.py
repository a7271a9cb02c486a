"""simlab's Hydra launcher (``hydra/launcher=simlab_joblib``): :mod:`.grouped`."""
