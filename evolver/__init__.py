"""evolver: a JAX research codebase in which LLM agents evolve themselves."""

__version__ = "0.1.0"
