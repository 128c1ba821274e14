"""Training: the policy's forward, batches, the optimiser step, and the processes that run them.

  policy         log-probs and entropies under the trainer's model
  forward_parts  shared prompt forward, output head on scored positions
  batch          rollouts to padded tensors, mini-/micro-batch rows
  optimise       one training step (accumulation, clipping, skip rule)
  packing        padding-free packed micro-batches and their attention
  layout         default sharding / checkpointing by model size and GPU count
  team           one or several processes: sampling, scoring, stepping
  distributed    process group helpers
  fsdp           FSDP2 wrapping and whole-tensor gathers
  flops          model FLOPs per step
  memory_plan    GPU memory estimate for a shape
"""
