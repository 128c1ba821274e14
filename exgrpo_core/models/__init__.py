"""Policies: how a `model.name_or_path` becomes a (model, tokenizer) pair.

  load        tiny, tiny-sft, SmolLM2 (from its GGUF), a local folder or a hub name; checkpoints' shards
  build       the tiny tokenizer and model built locally; `save_policy`
  warm_start  `tiny-sft`: the tiny model after a supervised warm start, cached by its settings
"""
