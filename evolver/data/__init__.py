"""Trajectory data: types, AgentTraj JSON, TFDS builders, tokenization with masks, batching."""
