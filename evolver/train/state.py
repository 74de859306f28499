"""TrainState: everything a step updates, as one pytree (donated to the jitted step)."""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct


@struct.dataclass
class TrainState:
  step: jax.Array          # [] int32: updates applied
  params: nnx.State        # the policy's parameters
  opt_state: Any           # optax state, float32
  rng: jax.Array           # PRNG key for anything stochastic in the step


def create_train_state(params: nnx.State, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                    rng=jax.random.PRNGKey(seed))
