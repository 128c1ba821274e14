"""`exgrpo replay-what-if` on a finished tiny run: the table, the JSON report, one line for a bad run name."""

from __future__ import annotations

import json

import torch

from exgrpo_core import loop
from exgrpo_core.config.load import load_config
from exgrpo_core.run.session import open_session
from flows import cli

SETS = ["rollout.max_response_tokens=3", "rollout.group_size=4", "train.batch_size=8", "train.mini_batch_size=4",
        "buffer.start_threshold=0"]


def test_the_command_prints_both_sides_and_writes_the_report(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    cfg = load_config("tiny", [f"run.output_dir={tmp_path}", f"run.db_url={url}", "run.name=wi", *SETS])
    torch.manual_seed(0)
    s = open_session(cfg, verify=lambda texts, answers: [(float(i % 2), "correct") for i in range(len(texts))])
    try:
        for _ in range(4):
            loop.run_iteration(s)
    finally:
        s.close()
    out = tmp_path / "wi.json"
    args = ["replay-what-if", "--config", "tiny", "--run", "wi", "--db-url", url, "--out", str(out)]
    for o in [*SETS, "selection.mu=0.25"]:
        args += ["--set", o]
    assert cli.main(args) == 0
    shown = capsys.readouterr().out
    assert "policy (what if)" in shown and "share from k = 1" in shown and f"report: {out}" in shown
    report = json.loads(out.read_text())
    assert report["what_if"]["replays"] > 0 and report["actual"]["replays"] > 0
    assert report["what_if"]["target"]["1"] > report["what_if"]["target"]["3"]  # mu = 0.25 leans to k = 1
    assert cli.main(["replay-what-if", "--config", "tiny", "--run", "nope", "--db-url", url]) == 2
    assert capsys.readouterr().out.count("error") == 1
