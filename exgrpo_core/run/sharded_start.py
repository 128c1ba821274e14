"""FSDP2 start-up and resume without a whole model per process.

Every process builds the model on the meta device and shards it (`fsdp.shard_model`), then fills its
shard: from a checkpoint with weight shards each process reads its own part (dcp.load into the
sharded state dict); from anything else (a Hugging Face folder, a hub name, the tiny model, a
checkpoint with full weights) rank 0 alone loads the whole model and broadcasts it tensor by tensor
(set_model_state_dict with broadcast_from_rank0). Peak host memory: rank 0 one whole model plus its
shard, every other process its shard plus one tensor (benchmarks/scale/sharded_load.py measures it).
"""

from __future__ import annotations

from exgrpo_core.models import load as models
from exgrpo_core.run import checkpoint
from exgrpo_core.training import distributed as D, fsdp


def load_sharded_policy(source: str, *, device, bf16: bool, shape: tuple[int, ...], dtype: str = "float32",
                        cpu_offload: bool = False, tiny: dict | None = None, seed: int = 0,
                        warm_start: dict | None = None, hf_overrides: dict | None = None,
                        gradient_checkpointing: bool = False):
    """(sharded model, tokenizer) of `source` (a `model.name_or_path` or a checkpoint folder), as
    `models.load_policy` gives them but sharded over the processes' FSDP2 mesh `shape`; every process
    calls this."""
    full = None
    if checkpoint.has_weight_shards(source):
        model, tokenizer = models.empty_from_checkpoint(source, dtype, hf_overrides)
    else:
        if D.topology().is_main:
            full, tokenizer = models.load_policy(source, dtype=dtype, tiny=tiny, seed=seed, warm_start=warm_start,
                                                 hf_overrides=hf_overrides)
        parts = D.broadcast((full.config, full.generation_config, tokenizer) if full is not None else None)
        config, generation, tokenizer = parts
        model = models.empty_model(config, dtype)
        model.generation_config = generation
    if gradient_checkpointing:  # transformers 5 renamed it (the old name warns)
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    fsdp.shard_model(model, device, bf16=bf16, cpu_offload=cpu_offload, shape=shape)
    if full is None and checkpoint.has_weight_shards(source):
        fsdp.load_model_shards(model, f"{source}/{checkpoint.MODEL_SHARDS}")
    else:
        state = full.state_dict() if full is not None else None
        del full  # rank 0's whole copy goes once its tensors are broadcast
        fsdp.load_full_state(model, state)
    return model, tokenizer
