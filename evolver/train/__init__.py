"""evolver.train."""
