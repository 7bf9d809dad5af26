"""Sweeps: the planner (grid -> tree of shared segments), run names, and the driver that runs segments, fine-tuning and the report."""
