"""evolver.tasks."""
