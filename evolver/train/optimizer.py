"""Optimizer: AdamW with linear warmup then cosine or linear decay, global-norm gradient clipping."""

import gin
import optax


@gin.configurable
def make_optimizer(total_steps: int, *, learning_rate: float = 3e-4, warmup_steps: int = 20,
                   decay: str = "cosine", end_lr_ratio: float = 0.1, weight_decay: float = 0.01,
                   b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8, grad_clip: float = 1.0
                   ) -> optax.GradientTransformation:
  """AdamW over `total_steps` updates. Optimizer state stays float32 whatever the parameter dtype."""
  if decay not in ("cosine", "linear", "constant"):
    raise ValueError(f"decay must be 'cosine', 'linear' or 'constant', got {decay!r}")
  warmup_steps = min(warmup_steps, max(total_steps - 1, 0))
  end_lr = learning_rate * end_lr_ratio
  decay_steps = max(total_steps - warmup_steps, 1)
  if decay == "cosine":
    after = optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=end_lr_ratio)
  elif decay == "linear":
    after = optax.linear_schedule(learning_rate, end_lr, decay_steps)
  else:
    after = optax.constant_schedule(learning_rate)
  schedule = optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warmup_steps), after], [warmup_steps])
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip else []
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mu_dtype="float32"))
  return optax.chain(*parts)
