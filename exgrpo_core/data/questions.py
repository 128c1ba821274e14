"""Question loading: bundled sets, JSONL, Parquet (flat or verl), Hugging Face datasets.

Owns turning dataset rows into `Question`s (chat messages + ground truth) and a question into prompt
token ids. Flat rows become [system?] + user(question + "\\n" + instruction), the Qwen-math
convention of the paper's code; verl rows (`prompt` chat list, `reward_model.ground_truth`,
`data_source`) keep their messages as they are. The bundled easy sets exist for the CPU demo only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from exgrpo_core.types import Question

BUNDLED_DIR = Path(__file__).parent / "datasets"
_SPLIT_STEMS = {"train", "test", "valid", "validation", "dev", "eval", "data"}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class DataError(ValueError):
    """A dataset cannot be read; the message names the file, the row and the bad field."""


def load_questions(path: str, *, question_key: str = "question", answer_key: str = "answer",
                   system_prompt: str | None = None,
                   instruction: str = "Please reason step by step, and put your final answer within \\boxed{}.",
                   max_questions: int | None = None, locations: dict[str, str] | None = None,
                   prompt_template: str = "chat") -> list[Question]:
    """Read questions from `bundled:NAME`, a .jsonl / .parquet file, `hf:NAME[:CONFIG][:SPLIT]` or
    `gen:arith-<sft|train|test>` (generated two-digit arithmetic, exgrpo_core/data/arith.py) or
    `gen:arith3-<split>` (three-digit, arith3.py).

    Args:
        path: where the questions are (see above).
        question_key, answer_key: fields of flat rows (verl rows use `prompt` / `reward_model.ground_truth`).
        system_prompt: optional system message for flat rows.
        instruction: appended to the user message of flat rows after a newline ("" for none).
        max_questions: keep the first N questions.
        locations: when given, filled with uid -> the row's place ("line 12", "row 3") for reports.
        prompt_template: `chat` (the messages above, rendered by the tokenizer's chat template) or a
            raw prompt, a format string over {question} and optionally {instruction} (data.prompt_template;
            `with_template`): flat rows fill {question} with the question field, verl rows with their
            last user message; the system prompt is not used.

    Returns:
        Questions in file order. uid = the row's `id`/`uid`, else "<dataset>-<row index>".
    """
    if max_questions is not None and max_questions < 1:
        raise DataError(f"max_questions must be >= 1 (got {max_questions})")
    name, rows = _open(path)
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for index, (where, row) in enumerate(rows):
        q = _to_question(row, f"{path} {where}", f"{name}-{index}", name, question_key, answer_key,
                         system_prompt, instruction)
        if prompt_template != CHAT:
            text = row.get(question_key) if not isinstance(row.get("prompt"), list) else None
            q = with_template(q, prompt_template, text.strip() if isinstance(text, str) else q.text, instruction)
        if q.uid in seen:
            raise DataError(f"{path} {where}: duplicated uid {q.uid!r} (first seen at {seen[q.uid]})")
        seen[q.uid] = where
        _check_text(q, f"{path} {where}")
        questions.append(q)
        if locations is not None:
            locations[q.uid] = f"{path} {where}"
        if max_questions is not None and len(questions) >= max_questions:
            break
    if not questions:
        raise DataError(f"{path}: no questions found")
    return questions


CHAT = "chat"
"""data.prompt_template's default: the tokenizer's chat template over the question's messages."""


def with_template(q: Question, template: str, question: str, instruction: str) -> Question:
    """`q` prompted by the raw `template` (data.prompt_template): its prompt is template.format(question=...,
    instruction=...), also its one user message (so the experience store tells it from the chat-prompted one).

    Example: with_template(q, "User: {question} Answer: Let's think step by step.", "1+2", "") prompts
    "User: 1+2 Answer: Let's think step by step." (the paper's Llama-3.1-8B base prompt).
    """
    prompt = template.format(question=question, instruction=instruction)
    return Question(q.uid, ({"role": "user", "content": prompt},), q.answer, q.source, q.reward_style, prompt,
                    q.info)


def prompt_token_ids(tokenizer, question: Question, max_prompt_tokens: int) -> list[int]:
    """The question's prompt as token ids, keeping the LAST max_prompt_tokens: its chat prompt (generation
    prompt added), or, for a raw-template question (`question.prompt`), that text encoded with
    add_special_tokens=True, i.e. with the BOS a base model expects where the tokenizer defines one
    (Llama-3.1: <|begin_of_text|>; Qwen2.5: none).

    Example: the tiny tokenizer renders [user "1+2"] as "<bos><|user|>1+2\\n<|assistant|>", one id per
    character or marker; with max_prompt_tokens=3 only the ids of "2", "\\n", "<|assistant|>" remain.
    """
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1 (got {max_prompt_tokens})")
    if question.prompt is not None:
        return list(tokenizer(question.prompt, add_special_tokens=True)["input_ids"][-max_prompt_tokens:])
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"the tokenizer has no chat_template, so question {question.uid!r} cannot be "
                        "rendered as a chat prompt; use an instruct model or set tokenizer.chat_template")
    text = tokenizer.apply_chat_template(list(question.messages), add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template already holds BOS
    return list(ids[-max_prompt_tokens:])


def bundled_names() -> list[str]:
    """Names usable as `bundled:NAME`."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.jsonl"))


def _open(path: str) -> tuple[str, Iterator[tuple[str, dict]]]:
    """(dataset name, iterator of (position for messages, row dict)) for any supported source."""
    if path.startswith("bundled:"):
        name = path.removeprefix("bundled:")
        file = BUNDLED_DIR / f"{name}.jsonl"
        if not file.is_file():
            raise DataError(f"{path}: no bundled dataset {name!r}; available: {', '.join(bundled_names())}")
        return name, _jsonl_rows(file)
    if path.startswith("hf:"):
        return _hf_rows(path)
    if path.startswith("gen:"):  # generated in-process (exgrpo_core/data/arith.py, arith3.py)
        from exgrpo_core.data import arith, arith3

        name = path.removeprefix("gen:")
        task, _, split = name.partition("-")
        tasks = {"arith": arith, "arith3": arith3}
        if task not in tasks or split not in tasks[task].SPLITS:
            raise DataError(f"{path}: no generated dataset {name!r}; available: "
                            f"{', '.join(f'{t}-{s}' for t, m in tasks.items() for s in m.SPLITS)}")
        return name, ((f"row {i + 1}", row) for i, row in enumerate(tasks[task].rows(split)))
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"{path}: file not found")
    split_named = file.stem.split(".")[0] in _SPLIT_STEMS  # train.jsonl, test.id.parquet: prefix the folder
    name = f"{file.parent.name}-{file.stem}" if split_named and file.parent.name else file.stem
    if file.suffix == ".jsonl":
        return name, _jsonl_rows(file)
    if file.suffix == ".parquet":
        return name, _parquet_rows(file)
    raise DataError(f"{path}: unsupported file type {file.suffix!r}; use .jsonl, .parquet, bundled:NAME or hf:NAME")


def _jsonl_rows(file: Path) -> Iterator[tuple[str, dict]]:
    with open(file, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{file} line {number}: not UTF-8 text (byte {err.start}: {raw[err.start:err.start + 1]!r}); "
                                "convert the file to UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{file} line {number}: unreadable JSON ({err.msg})") from None
            except RecursionError:
                raise DataError(f"{file} line {number}: JSON nested too deeply to read") from None
            if not isinstance(row, dict):
                raise DataError(f"{file} line {number}: expected a JSON object, got {type(row).__name__}")
            yield f"line {number}", row


def _parquet_rows(file: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        batches = pq.ParquetFile(file).iter_batches(batch_size=1024)
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{file}: unreadable parquet ({err})") from None


def _hf_rows(path: str) -> tuple[str, Iterator[tuple[str, dict]]]:
    parts = path.removeprefix("hf:").split(":")
    if not parts[0] or len(parts) > 3:
        raise DataError(f"{path}: expected hf:NAME, hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")
    name, config, split = parts[0], (parts[1] if len(parts) == 3 else None), (parts[-1] if len(parts) > 1 else "train")
    try:
        import datasets
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # noqa: BLE001 - the hub client raises many types; all mean "not available"
        raise DataError(
            f"{path}: could not load Hugging Face dataset {name!r} (split {split!r}): {type(err).__name__}: "
            f"{err}. The hub may be unreachable: download the data and pass a local .jsonl/.parquet path") from err
    tag = name.rsplit("/", 1)[-1] + (f"-{split}" if split else "")
    return tag, ((f"row {i + 1}", row) for i, row in enumerate(ds))


MAX_TEXT_CHARS = 200_000
"""Longest question or answer text read (characters): a longer one is a bad row, refused before any
tokenizer sees it (a 5 MB prompt made the tokenizer peak at 3.5 GB)."""


def _check_text(q: Question, where: str) -> None:
    """One line for text no run can use: a NUL character (PostgreSQL refuses it), a lone surrogate (no
    UTF-8 form), or more than MAX_TEXT_CHARS characters."""
    for field, text in [*((f"{m['role']} message", m["content"]) for m in q.messages), ("answer", q.answer)]:
        if "\x00" in text:
            raise DataError(f"{where}: the {field} contains a NUL character at position {text.index(chr(0))}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise DataError(f"{where}: the {field} contains a lone surrogate {text[err.start]!r} at position "
                            f"{err.start} (not valid Unicode text)") from None
        if len(text) > MAX_TEXT_CHARS:
            raise DataError(f"{where}: the {field} has {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} "
                            "a question may have (rollout.max_prompt_tokens truncates far below that)")


def _to_question(row: dict, where: str, default_uid: str, name: str, question_key: str, answer_key: str,
                 system_prompt: str | None, instruction: str) -> Question:
    uid = row.get("id", row.get("uid"))
    uid = default_uid if uid is None or str(uid) == "" else str(uid)
    if isinstance(row.get("prompt"), list) and isinstance(row.get("reward_model"), dict):
        messages = _verl_messages(row["prompt"], where)
        answer = _answer_text(row["reward_model"].get("ground_truth"), where, "reward_model.ground_truth")
        return Question(uid, messages, answer, str(row.get("data_source") or name),
                        str(row["reward_model"].get("style") or ""), info=_info(row, ("prompt",)))
    question = row.get(question_key)
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: missing or empty question field {question_key!r}")
    answer = _answer_text(row.get(answer_key), where, answer_key)
    user = question.strip() + ("\n" + instruction if instruction else "")
    messages = ({"role": "system", "content": system_prompt},) if system_prompt else ()
    source = row.get("data_source", row.get("source"))
    return Question(uid, messages + ({"role": "user", "content": user},), answer,
                    source if isinstance(source, str) and source else name, str(row.get("reward_style") or ""),
                    info=_info(row, (question_key,)))


def _info(row: dict, used: tuple[str, ...]) -> str:
    """The row's other fields as JSON for reward functions ("" when they do not serialise)."""
    try:
        return json.dumps({k: v for k, v in row.items() if k not in used}, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return ""


def _verl_messages(prompt: list, where: str) -> tuple[dict, ...]:
    messages = []
    for i, m in enumerate(prompt):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DataError(f"{where}: prompt[{i}] must be a {{'role': str, 'content': str}} message")
        messages.append({"role": m["role"], "content": m["content"]})
    if not messages:
        raise DataError(f"{where}: empty prompt")
    return tuple(messages)


def _answer_text(value, where: str, field: str) -> str:
    """Ground truth as text; GSM8K's "... #### 1,234" becomes "1234"."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(f"{where}: missing or non-text answer field {field!r} (got {type(value).__name__})")
    text = str(value).strip()
    if "####" in text:
        text = _THOUSANDS.sub("", text.rsplit("####", 1)[1].strip())
    if not text:
        raise DataError(f"{where}: empty answer field {field!r}")
    return text
