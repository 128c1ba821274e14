"""Policies built and saved on this machine: the `tiny` preset's character tokenizer and random
Llama-style model (no hub needed), and `save_policy`, the folder layout `from_pretrained` reads back.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from exgrpo_core.run.checkpoint import no_progress_bars

TINY = "tiny"

# Tiny vocabulary: special tokens, role markers, then one token per character.
_SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
_ROLES = ["<|system|>", "<|user|>", "<|assistant|>"]
_CHARS = ("0123456789+-*/=?., \n" "abcdefghijklmnopqrstuvwxyz" "ABCDEFGHIJKLMNOPQRSTUVWXYZ" "\\{}()$")
# System and user turns end with a newline; assistant turns end with EOS, which the model learns to emit.
_TINY_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")



def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer for the `tiny` preset, built locally with `tokenizers`.

    Example: tokenizer("2+3", add_special_tokens=False) gives 3 ids, one per character; "%" gives <unk>.

    Returns:
        A fast tokenizer with <pad>/<bos>/<eos>/<unk>, role markers and a system/user/assistant chat template.
    """
    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _ROLES + list(_CHARS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # concatenate characters back, no spaces in between
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>", extra_special_tokens=_ROLES)
    tokenizer.chat_template = _TINY_TEMPLATE
    return tokenizer


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, hidden_size: int = 64, num_layers: int = 2,
                     num_heads: int = 4, intermediate_size: int = 128, seed: int = 0,
                     config_overrides: dict | None = None) -> LlamaForCausalLM:
    """Seeded random Llama-style causal LM over the tiny tokenizer's vocabulary.

    The global torch RNG is left untouched (initialisation runs inside `fork_rng`). `config_overrides`:
    config fields set before the model is built (`model.hf_overrides`).
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=2048, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    config.update(dict(config_overrides or {}))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike) -> None:
    """Write model (safetensors) and tokenizer (with its chat template) so `from_pretrained(path)` reads them."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with no_progress_bars():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
