"""Two `exgrpo compare` / `exgrpo sweep` started together on a new local MLflow store (issue 35, item 7):
both look up their earlier parent run first (`_find_parent`), which opens the store; opening a new
SQLite store builds its tables, and two processes doing that at once fail with alembic errors. Four
processes released at the same moment must all find no parent and exit 0."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROCS = 4
CHILD = """
import sys, time
from pathlib import Path
from exgrpo_core.config.load import load_config
from flows.compare.flow import _find_parent
uri, folder, i = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
cfg = load_config("tiny", [f"run.mlflow_tracking_uri={uri}"])
(folder / f"ready{i}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
print("parent:", _find_parent(cfg, "cmp"))
"""


def test_comparisons_starting_together_on_a_new_store_all_open_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, uri, str(tmp_path), str(i)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(PROCS)]
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("ready*"))) < PROCS:  # all imported: release them at once
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate()[0][-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.05)
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * PROCS, [o[-1500:] for o in outs]
    assert all(o.strip().endswith("parent: None") for o in outs), outs
