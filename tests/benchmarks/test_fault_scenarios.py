"""The targeted faults of issue 35 in the suite (benchmarks/reliability/scenarios.py runs all of them):
two starts of a new run at once, and a database moved away after a checkpoint. Each refused start is one
line; the run that goes on ends exactly where an uninterrupted run does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.reliability import fault_injection as fi, scenarios  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    work = tmp_path_factory.mktemp("fault-scenarios")
    env, _, ref = fi.reference_run(work, STEPS)
    return work, env, ref


@pytest.mark.parametrize("name", ["fresh_starts_together", "moved_database"])
def test_scenario_ends_exactly_with_one_line_refusals(reference, name):
    work, env, ref = reference
    root = work / name
    root.mkdir()
    out = scenarios.SCENARIOS[name](root, env, STEPS, ref, "sqlite")
    assert out["refusals"] and all(r["one_line"] for r in out["refusals"]), out["refusals"]
    assert not out["leaked"], out["leaked"]
    assert (out["rows_lost"], out["rows_extra"], out["duplicate_points"], out["orphaned_runs"]) == (0, 0, 0, 0), out
    assert out["exact"], out


@pytest.mark.postgres
def test_postgres_databases_of_a_benchmark_are_dropped(tmp_path):
    import psycopg

    def names() -> set[str]:
        with psycopg.connect(fi.ADMIN) as c:
            return {n for (n,) in c.execute("select datname from pg_database where datname like 'fi\\_%'")}

    url = fi.db_for("postgres", tmp_path)
    made = url.rsplit("/", 1)[1]
    assert made in names()
    fi.drop_created()
    assert made not in names()
    fi.drop_created()  # (again: nothing left to drop)
