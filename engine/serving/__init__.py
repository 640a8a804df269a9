"""Served engines (vLLM, SGLang) as kernelbot engines: a server started on loopback and stopped by its own process
group (server.py), each engine's HTTP dialect (apis.py), a seeded load generator (load.py), fidelity from the
engine's own logprobs (fidelity.py), and the engine object the optimisation loop drives (served_engine.py)."""
