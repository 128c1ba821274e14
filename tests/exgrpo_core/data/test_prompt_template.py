"""data.prompt_template (the paper's raw Llama-3.1-8B base prompt): exact prompt token ids in training and evaluation."""

from __future__ import annotations

import json

import pytest
from tokenizers import processors

from exgrpo_core.config.load import ConfigError, load_config
from exgrpo_core.data import questions as data
from exgrpo_core.evaluation import evaluate as E
from exgrpo_core.models.build import build_tiny_tokenizer
from exgrpo_core.run.session import open_session
from flows.eval_tasks import load_items

LLAMA_BASE = "User: {question} Answer: Let's think step by step."


def _rows(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"question": " 1+2 ", "answer": "3"},
                                                         {"question": "4+5", "answer": "9"}]))
    return path


def _bos_tokenizer():
    """The tiny tokenizer with a BOS post-processor, as a Llama-3.1 base tokenizer has (<|begin_of_text|>)."""
    tok = build_tiny_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tok.bos_token_id)])
    return tok


@pytest.mark.parametrize("make", [build_tiny_tokenizer, _bos_tokenizer])
def test_raw_template_ids_are_the_tokenizers_encoding_of_the_formatted_text(tmp_path, make):
    tok = make()
    q = data.load_questions(str(_rows(tmp_path)), prompt_template=LLAMA_BASE)[0]
    text = "User: 1+2 Answer: Let's think step by step."
    assert q.prompt == text and q.messages == ({"role": "user", "content": text},)
    ids = data.prompt_token_ids(tok, q, 1024)
    assert ids == tok(text, add_special_tokens=True)["input_ids"]
    assert (ids[0] == tok.bos_token_id) == (make is _bos_tokenizer)  # BOS exactly where the tokenizer adds it
    assert data.prompt_token_ids(tok, q, 5) == ids[-5:]


def test_instruction_field_and_verl_rows(tmp_path):
    q = data.load_questions(str(_rows(tmp_path)), instruction="Box it.", prompt_template="Q: {question}\n{instruction}\nA:")[1]
    assert q.prompt == "Q: 4+5\nBox it.\nA:"
    verl = data.load_questions("bundled:tiny-arith", max_questions=1)[0]  # any set: the chat-prompted question
    assert verl.prompt is None


def test_chat_default_gives_todays_ids(tmp_path):
    tok = build_tiny_tokenizer()
    q = data.load_questions(str(_rows(tmp_path)))[0]
    assert q.prompt is None and load_config("tiny").data.prompt_template == "chat"
    text = "<bos><|user|>1+2\nPlease reason step by step, and put your final answer within \\boxed{}.\n<|assistant|>"
    assert tok.apply_chat_template(list(q.messages), add_generation_prompt=True, tokenize=False) == text
    assert data.prompt_token_ids(tok, q, 1024) == tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(("bad", "why"), [("no field here", "has no {question}"),
                                          ("{question} {answer}", "has unknown field(s) {answer}"),
                                          ("{0} {question}", "has unknown field(s) {0}"),
                                          ("{question", "is not a format string"),
                                          ("{instruction} only", "has no {question}")])
def test_a_bad_template_is_a_config_error(bad, why):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", [f"data.prompt_template={json.dumps(bad)}"])
    line = next(l for l in str(err.value).splitlines() if "data.prompt_template" in l)
    assert f"data.prompt_template {bad!r} {why}" in line


def test_a_system_prompt_needs_the_chat_template():
    assert load_config("tiny", ["data.system_prompt=Be brief."]).data.system_prompt == "Be brief."
    with pytest.raises(ConfigError, match="data.system_prompt needs data.prompt_template=chat"):
        load_config("tiny", ["data.system_prompt=Be brief.", f"data.prompt_template={json.dumps(LLAMA_BASE)}"])


def _cfg(tmp_path, template):
    rows = _rows(tmp_path)
    return load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url=sqlite:///{tmp_path / 'x.db'}",
                                f"data.train_path={rows}", f"data.eval_path={rows}",
                                f"data.prompt_template={json.dumps(template)}", "eval.suites=[]"])


class _Captured(Exception):
    pass


class _Engine:
    def generate(self, prompts, *args, **kwargs):
        self.prompts = prompts
        raise _Captured


@pytest.mark.parametrize("template", [LLAMA_BASE, "chat"])
def test_evaluation_prompts_follow_the_template(tmp_path, template):
    cfg, tok = _cfg(tmp_path, template), build_tiny_tokenizer()
    items = load_items(cfg)
    engine = _Engine()
    with pytest.raises(_Captured):
        E.generate_and_grade(None, tok, items, lambda t, a: [(0.0, "wrong")] * len(t), engine=engine)
    expected = ([tok("User: 1+2 Answer: Let's think step by step.")["input_ids"],
                 tok("User: 4+5 Answer: Let's think step by step.")["input_ids"]] if template != "chat" else
                [tok(tok.apply_chat_template([{"role": "user", "content": x + ("\n" + cfg.data.instruction if cfg.data.instruction else "")}],
                                             add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"] for x in ("1+2", "4+5")])
    assert sorted(engine.prompts) == sorted(expected)


@pytest.mark.parametrize("template", [LLAMA_BASE, "chat"])
def test_training_prompts_follow_the_template(tmp_path, template):
    cfg = _cfg(tmp_path, template)
    s = open_session(cfg, verify=lambda t, a: [(0.0, "wrong")] * len(t))
    try:
        tok = s.tokenizer
        got = [s.prompt_ids(uid) for uid in sorted(s.questions)]
    finally:
        s.close()
    expected = ([tok("User: 1+2 Answer: Let's think step by step.")["input_ids"],
                 tok("User: 4+5 Answer: Let's think step by step.")["input_ids"]] if template != "chat" else
                [tok(tok.apply_chat_template([{"role": "user", "content": x + ("\n" + cfg.data.instruction if cfg.data.instruction else "")}],
                                             add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"] for x in ("1+2", "4+5")])
    assert got == expected
