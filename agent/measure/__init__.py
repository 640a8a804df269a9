"""Measuring: the timing protocol (timing.py), the pack in the engine end to end (end_to_end.py), the never-slower gate
(gate.py), torch.compile of a task's region (compile_baseline.py)."""
