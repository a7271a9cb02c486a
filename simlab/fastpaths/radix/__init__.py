"""The compiled radix-tree replay and its alpha tuning."""
