"""eval.temperature = 0: greedy decoding, the same answer for every sample and every seed."""

import torch

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.rollout.engine import TransformersEngine


def test_temperature_zero_is_greedy_and_positive_temperature_samples():
    tok = build_tiny_tokenizer()
    engine = TransformersEngine(build_tiny_model(tok, seed=1), tok, batch_size=16)
    prompt = [tok("<bos><|user|>12+34=?\n<|assistant|>", add_special_tokens=False)["input_ids"]]
    runs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        runs.append([g.response_ids for g in engine.generate(prompt, 6, temperature=0, max_new_tokens=8)[0]])
    assert all(r == runs[0][0] for run in runs for r in run)
    torch.manual_seed(0)
    sampled = [tuple(g.response_ids) for g in engine.generate(prompt, 6, temperature=1.0, max_new_tokens=8)[0]]
    assert len(set(sampled)) > 1  # a random model at temperature 1 does not repeat itself six times
