"""Model FLOPs for MFU (PaLM appendix B): 6 per matmul parameter per token plus attention."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from exgrpo_core.training.flops import matmul_params, model_train_flops, train_flops


def test_matmul_params_count_linear_weights_only():
    net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2, bias=False))
    assert matmul_params(net) == 4 * 3 + 3 * 2


def test_train_flops_formula():
    assert train_flops(100, 2, 8, [3]) == 3 * (600 + 12 * 2 * 8 * 3)
    assert train_flops(100, 2, 8, [3, 5]) == train_flops(100, 2, 8, [3]) + train_flops(100, 2, 8, [5])


def test_llama_counts_the_layers_and_head():
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    per_layer = 32 * 32 * 2 + 2 * (32 * 16) + 3 * 32 * 64  # q, o; k, v (2 KV heads of 8); gate, up, down
    n = 2 * per_layer + 32 * 50  # + the output head
    assert matmul_params(model) == n
    assert model_train_flops(model, [7]) == 7 * (6 * n + 12 * 2 * 32 * 7)
