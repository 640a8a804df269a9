"""Hotspots into tasks: the planner (plan.py), a family's or an extracted reference as a KernelBench task (tasks.py,
extract.py)."""
