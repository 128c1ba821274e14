"""Rollout engines behind one `generate` signature, and how weights reach them.

  engine        the protocol and the transformers engine (CPU and GPU)
  decode        its eager decode loop and sampler (CPU); static_decode: the GPU path (bf16 copy, fixed shapes)
  vllm_engine   vLLM, colocated with the trainer
  remote        a stock `vllm serve` on another node, through vLLM's RL routes and weight transfer
  sync          push weights to an external engine and prove they landed
"""
