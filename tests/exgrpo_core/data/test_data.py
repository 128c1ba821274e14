"""Tests of exgrpo_core/data/questions.py: every source format, error messages, and prompt tokenisation.

Fixtures are samples of the real files (GSM8K train.jsonl, the verl `valid.parquet` of the paper's
eval suite) copied into tests/exgrpo_core/fixtures/, so the tests do not need /work/shared.
Run: .venv/bin/python -m pytest tests/exgrpo_core/data/test_data.py -q
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exgrpo_core.data.questions import DataError, bundled_names, load_questions, prompt_token_ids
from exgrpo_core.models.build import build_tiny_tokenizer
from exgrpo_core.reward.grading import grade

FIXTURES = Path(__file__).parent / "fixtures"
GSM8K = FIXTURES / "gsm8k_train_sample.jsonl"
VERL = FIXTURES / "verl_valid_sample.jsonl"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def verl_parquet(tmp_path) -> Path:
    """A 5-row verl parquet (prompt chat list, reward_model struct, data_source) like valid.parquet."""
    rows = [json.loads(line) for line in VERL.read_text().splitlines()]
    path = tmp_path / "exgrpo-eval" / "valid.parquet"  # the layout of ../shared/data
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_gsm8k_jsonl_becomes_user_message_with_instruction_and_numeric_answer():
    qs = load_questions(str(GSM8K))
    assert len(qs) == 5
    q = qs[0]
    assert q.answer == "72"  # "... #### 72" -> "72"
    assert q.uid == "gsm8k_train_sample-0"  # no id field: "<dataset>-<row index>"
    assert q.source == "gsm8k_train_sample"
    assert q.messages == ({"role": "user", "content": q.text},)
    assert q.text.startswith("Natalia sold clips") and q.text.endswith("\n" + INSTRUCTION)
    assert len({q.uid for q in qs}) == 5


def test_system_prompt_instruction_and_max_questions():
    qs = load_questions(str(GSM8K), system_prompt="Be brief.", instruction="", max_questions=2)
    assert len(qs) == 2
    assert qs[0].messages[0] == {"role": "system", "content": "Be brief."}
    assert qs[0].messages[1]["content"] == json.loads(GSM8K.read_text().splitlines()[0])["question"]


def test_split_named_files_take_their_folder_name(tmp_path, verl_parquet):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text(GSM8K.read_text())
    assert load_questions(str(tmp_path / "gsm8k" / "train.jsonl"))[0].uid == "gsm8k-train-0"
    renamed = verl_parquet.rename(verl_parquet.parent / "test.id.parquet")
    assert load_questions(str(renamed))[0].uid == "exgrpo-eval-test.id-0"


def test_gsm8k_thousands_separator_is_stripped(tmp_path):
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "so 1,000+234\n#### 1,234"}])
    assert load_questions(str(path))[0].answer == "1234"


def test_verl_parquet_keeps_messages_and_reads_ground_truth(verl_parquet):
    qs = load_questions(str(verl_parquet))
    assert [q.source for q in qs] == ["aime", "math", "olympiad_bench", "amc", "minerva"]
    assert qs[0].answer == "204" and qs[1].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    raw = json.loads(VERL.read_text().splitlines()[0])["prompt"]
    assert [m["role"] for m in qs[0].messages] == ["system", "user"]
    assert qs[0].messages == tuple({"role": m["role"], "content": m["content"]} for m in raw)  # untouched
    assert qs[0].uid == "exgrpo-eval-valid-0" and qs[4].uid == "exgrpo-eval-valid-4"  # split-named file
    assert grade("so it is \\boxed{(3, \\pi/2)}", qs[1].answer) == (1.0, "correct")


def test_verl_rows_in_jsonl_are_detected_too():
    qs = load_questions(str(VERL), max_questions=1)
    assert qs[0].source == "aime" and qs[0].messages[0]["role"] == "system"


def test_flat_parquet_with_custom_keys_and_ids(tmp_path):
    path = tmp_path / "flat.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "problem": "1+1", "solution": 2},
                                         {"id": "b", "problem": "2+2", "solution": 4}]), path)
    qs = load_questions(str(path), question_key="problem", answer_key="solution")
    assert [(q.uid, q.answer) for q in qs] == [("a", "2"), ("b", "4")]


@pytest.mark.parametrize("rows, message", [
    ([{"question": "ok", "answer": "1"}, {"question": "", "answer": "2"}], "line 2: missing or empty question"),
    ([{"question": "ok", "answer": "1"}, {"question": "q"}], "line 2: missing or non-text answer field 'answer'"),
    ([{"question": "ok", "answer": "  "}], "line 1: empty answer field"),
    ([{"question": "ok", "answer": "1"}, "{not json"], "line 2: unreadable JSON"),
    (["[1, 2]"], "line 1: expected a JSON object"),
    ([{"id": 7, "question": "a", "answer": "1"}, {"id": 7, "question": "b", "answer": "2"}],
     "line 2: duplicated uid '7' \\(first seen at line 1\\)"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, rows, message):
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=f"bad.jsonl {message}" if "line" in message else message):
        load_questions(str(path))


def test_bad_verl_row_and_bad_parquet_row_number(tmp_path):
    path = tmp_path / "v.parquet"
    good = {"prompt": [{"role": "user", "content": "1+1"}], "reward_model": {"ground_truth": "2"}, "data_source": "x"}
    bad = {"prompt": [{"role": "user", "content": "2+2"}], "reward_model": {"ground_truth": None}, "data_source": "x"}
    pq.write_table(pa.Table.from_pylist([good, bad]), path)
    with pytest.raises(DataError, match="v.parquet row 2: missing or non-text answer field 'reward_model.ground_truth'"):
        load_questions(str(path))


@pytest.mark.parametrize("source, message", [
    ("bundled:nope", "no bundled dataset 'nope'; available: .*tiny-arith"),
    ("/no/such/file.jsonl", "file not found"),
    ("hf:", "expected hf:NAME"),
])
def test_bad_sources(source, message):
    with pytest.raises(DataError, match=message):
        load_questions(source)


def test_unsupported_extension_and_empty_file(tmp_path):
    (tmp_path / "q.csv").write_text("question,answer\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_questions(str(tmp_path / "q.csv"))
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no questions found"):
        load_questions(str(tmp_path / "e.jsonl"))


def test_hf_dataset_offline_gives_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="hub may be unreachable: download the data and pass a local"):
        load_questions("hf:exgrpo-no-such-org/no-such-dataset:test")


def test_bundled_sets_load_and_tiny_arith_fits_the_tiny_tokenizer():
    assert {"tiny-arith", "arith-easy", "arith-easy-test", "gsm8k-easy", "gsm8k-easy-test"} <= set(bundled_names())
    tok = build_tiny_tokenizer()
    tiny = load_questions("bundled:tiny-arith")
    assert 50 <= len(tiny) <= 80
    for q in tiny:
        assert q.answer in set("0123456789")
        ids = prompt_token_ids(tok, q, 1024)
        assert tok.unk_token_id not in ids, f"{q.uid}: character outside the tiny vocabulary"
    for name in ("arith-easy", "arith-easy-test", "gsm8k-easy", "gsm8k-easy-test"):
        assert len(load_questions(f"bundled:{name}")) >= 50


def test_bundled_train_and_test_splits_do_not_overlap():
    for name in ("arith-easy", "gsm8k-easy"):
        train = {q.text for q in load_questions(f"bundled:{name}")}
        test = {q.text for q in load_questions(f"bundled:{name}-test")}
        assert not train & test


def test_prompt_token_ids_renders_chat_template_and_keeps_the_tail():
    tok = build_tiny_tokenizer()
    q = load_questions("bundled:tiny-arith", instruction="", max_questions=1)[0]
    full = prompt_token_ids(tok, q, 1024)
    text = tok.decode(full)
    # "<bos><|user|>" + question + "\n" + "<|assistant|>": one id per character or marker
    assert text == "<bos><|user|>" + q.text + "\n<|assistant|>"
    assert len(full) == 2 + len(q.text) + 2
    assert prompt_token_ids(tok, q, 3) == full[-3:]
    assert tok.decode(full[-1:]) == "<|assistant|>"


def test_prompt_token_ids_needs_a_chat_template():
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    q = load_questions("bundled:tiny-arith", max_questions=1)[0]
    with pytest.raises(DataError, match="no chat_template"):
        prompt_token_ids(tok, q, 16)
