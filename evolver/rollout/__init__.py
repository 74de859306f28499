"""evolver.rollout."""
