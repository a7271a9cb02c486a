"""Replays over whole blocks: FIFO and Belady on block ids, in Python and compiled."""
