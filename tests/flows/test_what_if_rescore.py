"""`exgrpo replay-what-if --rescore`: a tiny run checkpointed after every step, its replay what-if re-scored
under its own checkpoints; the numbers against a plain forward pass, and one line for a bad checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch
from sqlalchemy import select

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer, save_policy
from exgrpo_core.models.load import load_policy
from exgrpo_core.run.session import open_session
from exgrpo_core.store import codec
from exgrpo_core.store.experience_store import ExperienceStore
from exgrpo_core.store.tables import QuestionState as QS, Replay, Trajectory
from flows import cli

SETS = ["rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8", "train.mini_batch_size=4",
        "buffer.start_threshold=0", "data.max_questions=24", "run.keep_checkpoints=10"]
BETA = 0.1  # the tiny preset's loss.shaping_beta (policy shaping on)


def half_right(texts, answers):
    return [(1.0, "correct") if i % 3 else (0.0, "wrong") for i in range(len(texts))]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run `wi`, 5 steps, a checkpoint after each (step_000001 .. step_000005); the trainer's prompts."""
    tmp = tmp_path_factory.mktemp("rescore")
    url = f"sqlite:///{tmp / 'x.db'}"
    cfg = load_config("tiny", [f"run.output_dir={tmp}", f"run.db_url={url}", "run.name=wi", *SETS])
    torch.manual_seed(0)
    s = open_session(cfg, verify=half_right)
    try:
        for _ in range(5):
            loop.run_iteration(s)
            s.save()
        prompts = {q: s.prompt_ids(q) for q in s.questions}
        run_id = s.run_id
    finally:
        s.close()
    return tmp, url, run_id, prompts


def rescored(tmp, url, checkpoint: str, capsys, out: str = "r.json") -> dict:
    args = ["replay-what-if", "--config", "tiny", "--run", "wi", "--db-url", url, "--out", str(tmp / out),
            "--rescore", checkpoint, "--set", f"run.output_dir={tmp}", "--set", "selection.mu=0.25"]
    for o in SETS:
        args += ["--set", o]
    assert cli.main(args) == 0
    shown = capsys.readouterr().out
    assert "rescoring under" in shown and "lowest-entropy choice changed" in shown
    return json.loads((tmp / out).read_text())["rescore"]


def stored(url: str, run_id: str) -> dict[int, tuple]:
    """{trajectory id: (question uid, response ids, behaviour log-probs)} as the run stored them."""
    with ExperienceStore(url) as store, store.engine.connect() as conn:
        rows = conn.execute(select(Trajectory.id, Trajectory.question_id, Trajectory.token_ids,
                                   Trajectory.behaviour_logprobs).where(Trajectory.run_id == run_id)).all()
        uids = dict(conn.execute(select(QS.question_id, QS.uid).where(QS.run_id == run_id)).all())
    return {t: (uids[q], codec.decode_token_ids(ids), codec.decode_logprobs(lp)) for t, q, ids, lp in rows}


def plain_scores(model, prompt: list[int], response: list[int]) -> tuple[list[float], float]:
    """Token log-probs and mean token entropy of `response` after `prompt`: one unbatched forward, T = 1."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].double()  # [T, V] predicting the response
    logp = torch.log_softmax(logits, -1)
    tok = logp[torch.arange(len(response)), torch.tensor(response)]
    ent = -(logp.exp() * logp).sum(-1)
    return tok.tolist(), float(ent.mean())


def test_under_its_own_checkpoint_the_numbers_are_a_plain_forward_s(run, capsys):
    tmp, url, run_id, prompts = run
    rs = rescored(tmp, url, str(tmp / "wi" / "checkpoints" / "step_000005"), capsys)
    assert rs["step"] == 5 and rs["run_id"] == run_id and rs["shaping_beta"] == BETA and rs["temperature"] == 1
    model, _ = load_policy(str(tmp / "wi" / "checkpoints" / "step_000005"))
    rows = stored(url, run_id)
    assert len(rs["trajectories"]) > 4
    for tid, s in rs["trajectories"].items():
        uid, response, behaviour = rows[int(tid)]
        logp, h = plain_scores(model.eval(), prompts[uid], response)
        ratio = [a - b for a, b in zip(logp, behaviour)]
        assert s["seq_log_ratio"] == pytest.approx(sum(ratio), abs=1e-4)
        assert s["token_log_ratio"] == pytest.approx(sum(ratio) / len(ratio), abs=1e-4)
        assert s["weight"] == pytest.approx(sum(math.exp(r) / (math.exp(r) + BETA) for r in ratio) / len(ratio),
                                            abs=1e-5)
        assert s["entropy"] == pytest.approx(h, abs=1e-5)
    moved = [abs(s["seq_log_ratio"]) for s in rs["trajectories"].values()]
    assert max(moved) > 1e-3  # four updates later the policy has moved
    for arm in ("what_if", "actual"):
        steps = [r for r in rs["per_step"] if r["arm"] == arm]
        assert sum(r["trajectories"] for r in steps) == rs["summary"][arm]["trajectories"] > 0
        share = rs["summary"][arm]["lowest_changed"]
        assert share is None or 0 <= share <= 1


def test_under_the_checkpoint_that_sampled_it_a_trajectory_has_not_moved(run, capsys):
    tmp, url, run_id, _ = run
    first = rescored(tmp, url, "step_5", capsys)
    late = max(first["trajectories"].values(), key=lambda s: s["sampled_step"])
    t = late["sampled_step"]  # sampled by the weights at step t's start: those after step t - 1, step_t
    assert t >= 1
    rs = rescored(tmp, url, f"step_{t}", capsys, out="t.json")
    mine = [s for s in rs["trajectories"].values() if s["sampled_step"] == t]
    assert mine and all(abs(s["seq_log_ratio"]) < 1e-4 for s in mine)
    assert all(s["weight"] == pytest.approx(1 / (1 + BETA), abs=1e-5) for s in mine)
    assert any(abs(s["seq_log_ratio"]) > 1e-3 for s in rs["trajectories"].values() if s["sampled_step"] < t - 1)


def test_the_run_chose_the_lowest_entropy_under_the_weights_of_its_step(run, capsys):
    """The run's replays at step t were chosen by H(o) under the policy at t's start: step_t re-scores them so."""
    tmp, url, run_id, _ = run
    with ExperienceStore(url) as store, store.engine.connect() as conn:
        replays = conn.execute(select(Replay.step, Replay.trajectory_id, Replay.entropy)
                               .where(Replay.run_id == run_id)).all()
    some = rescored(tmp, url, "step_5", capsys, out="c.json")["choices"]  # which steps chose among several
    t = max({c["step"] for c in some if c["arm"] == "actual"}, key=lambda s: sum(c["step"] == s for c in some))
    rs = rescored(tmp, url, f"step_{t}", capsys, out="c.json")
    at_t = [(tid, h) for step, tid, h in replays if step == t]
    assert at_t and all(rs["trajectories"][str(tid)]["entropy"] == pytest.approx(h, abs=1e-5) for tid, h in at_t)
    mine = [c for c in rs["choices"] if c["arm"] == "actual" and c["step"] == t]
    assert mine and all(c["lowest_checkpoint"] == c["chosen"] for c in mine)  # the run's own choice, re-derived
    row = next(r for r in rs["per_step"] if r["arm"] == "actual" and r["step"] == t)
    assert row["questions_compared"] == len(mine)
    assert row["lowest_changed"] == sum(c["lowest_stored"] != c["chosen"] for c in mine) / len(mine)


def test_a_bad_checkpoint_is_one_line_before_any_scoring(run, capsys, tmp_path):
    tmp, url, _, _ = run
    tok = build_tiny_tokenizer()
    save_policy(build_tiny_model(tok, hidden_size=32), tok, tmp_path / "narrow")
    other = build_tiny_tokenizer()
    other.add_tokens(["<other>"])
    save_policy(build_tiny_model(tok), other, tmp_path / "other-tok")
    for bad, says in ((tmp_path / "missing", "does not exist"), (tmp_path / "narrow", "another model"),
                      (tmp_path / "other-tok", "another tokenizer"), ("step_99", "does not exist")):
        args = ["replay-what-if", "--config", "tiny", "--run", "wi", "--db-url", url, "--rescore", str(bad),
                "--out", str(tmp_path / "x.json")]
        assert cli.main(args) == 2
        shown = capsys.readouterr().out
        assert shown.count("error") == 1 and says in shown and "rescoring" not in shown, shown
        assert not (tmp_path / "x.json").exists()
