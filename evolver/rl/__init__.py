"""evolver.rl."""
