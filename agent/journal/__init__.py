"""What a run has done, kept across crashes and sessions: the journal (journal.py), the run's state (run_state.py), LLM
answers replayed (replay.py)."""
