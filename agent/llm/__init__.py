"""LLM-driven kernel generation (`kernelbot optimize --llm MODEL`): litellm client, prompt, extraction, loop, and
answers recorded in and replayed from the run's journal (replay.py)."""
