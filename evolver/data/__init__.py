"""Trajectory data: types, AgentTraj JSON, TFDS builders, tokenization with masks, batching.

  trajectory     Message, Trajectory (what rollouts produce and datasets store), OPENING_REPLY
  agenttraj      read_agenttraj / write_agenttraj: AgentGym's AgentTraj JSON, with evolver's extra keys
  expert         expert_trajectory(env_name, index, split): the scripted experts as ReAct conversations
  tfds_builders  expert_trajectories and agent_traj_json (array_record, no TensorFlow); load_expert_source
  tfds_cli       `python -m evolver.data.tfds_cli build ...`: tfds' build command without TensorFlow
  tokenize       tokenize_trajectory -> TokenizedExample (input_ids, loss_mask, exp_mask, advantages, ...)
  batching       make_batch / collate / batch_trajectories; BatchIterator (bucketed, exactly resumable);
                 expert_batch_iterator, the BC data in one call

Submodules are imported explicitly (`from evolver.data import batching`): tfds is only loaded where needed.
"""
