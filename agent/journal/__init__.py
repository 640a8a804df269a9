"""What a run has done, kept across crashes and sessions: the journal (db.py), the run's state (run_state.py), the
progress of cluster work (progress.py). LLM answers are replayed through it by agent/llm/replay.py."""
