"""Hotspots into tasks: the planner (plan.py), a family's or an extracted reference as a KernelBench task
(references.py, extract.py)."""
