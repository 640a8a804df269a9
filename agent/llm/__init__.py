"""LLM-driven kernel generation (`kernelbot optimize --llm MODEL`): litellm client, prompt, extraction, loop."""
