"""Candidates without an LLM: the built-in proposer (proposer.py) and generated C++ for any task (aten_cpp/)."""
