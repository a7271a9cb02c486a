"""Exact, faster replays (stack distances, block heaps, the compiled radix replay) that give the records the request step gives."""
