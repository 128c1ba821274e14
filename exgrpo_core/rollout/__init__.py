"""Rollout engines behind one `generate` signature, and how weights reach them.

  engine        the protocol and the transformers engine (CPU and GPU)
  vllm_engine   vLLM, colocated with the trainer
  remote        an engine on a rollout server, over HTTP
  server        `exgrpo rollout-server`
  sync          push weights to an external engine and prove they landed
  weight_group  broadcast pushes (gloo / NCCL) to a rollout server
"""
