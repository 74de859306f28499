"""evolver.rollout: multi-turn policy x environment interaction -> trajectories with token arrays."""

from evolver.rollout.engine import (FINISH_REASONS, Rollout, RolloutBatch, RolloutConfig, RolloutEngine,
                                    RolloutStats, Task, agentgym_opening, rollout)
from evolver.rollout.turns import TemplateError

__all__ = ["FINISH_REASONS", "Rollout", "RolloutBatch", "RolloutConfig", "RolloutEngine", "RolloutStats", "Task",
           "TemplateError", "agentgym_opening", "rollout"]
