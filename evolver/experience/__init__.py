"""evolver.experience."""
