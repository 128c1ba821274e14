"""The final evaluation is never silent (a line after a chunk, at most one per `min_gap_s`, and one every
`every_s` seconds without one), and a quick one is not a line per chunk."""

from __future__ import annotations

import re
import time

from flows.eval_tasks import EvalProgress


def test_lines_per_chunk_and_between_chunks(capsys):
    with EvalProgress("eval step 4", 78, every_s=0.2, min_gap_s=0) as progress:
        time.sleep(0.5)  # a long first chunk: heartbeats with nothing done yet
        progress(40, 78)
        progress(78, 78)
    time.sleep(0.4)  # stopped: no line after the block
    lines = capsys.readouterr().out.splitlines()
    assert all(re.fullmatch(r"eval step 4: \d+/78 questions, \d+ s", x) for x in lines), lines
    done = [int(x.split(": ")[1].split("/")[0]) for x in lines]
    assert done[:2] == [0, 0] and done[-2:] == [40, 78] and len(done) <= 5, done


def test_a_quick_evaluation_of_many_chunks_is_one_line(capsys):
    with EvalProgress("eval", 22, every_s=30) as progress:  # 22 chunks within the 5 s minimum gap
        for done in range(1, 23):
            progress(done, 22)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eval: 22/22 questions"), lines
