"""kernelbot: an autonomous kernel-optimisation agent for LLM inference engines."""

__version__ = "0.1.0"


class KernelbotError(Exception):
    """A problem the user can fix; the CLI prints it as one line, never a traceback."""
