"""evolver.rollout: multi-turn policy x environment interaction -> trajectories with token arrays."""

from evolver.rollout.engine import (FINISH_REASONS, EpisodeOpening, OpeningChange, OpeningTransform, Rollout,
                                    RolloutBatch, RolloutConfig, RolloutEngine, RolloutStats, Task, agentgym_opening,
                                    episode_keys, rollout, task_hash)
from evolver.rollout.api import APIRolloutEngine
from evolver.rollout.strip import strip_added

__all__ = ["APIRolloutEngine", "FINISH_REASONS", "EpisodeOpening", "OpeningChange", "OpeningTransform", "Rollout",
           "RolloutBatch", "RolloutConfig", "RolloutEngine", "RolloutStats", "Task", "agentgym_opening",
           "episode_keys", "rollout", "strip_added", "task_hash"]
