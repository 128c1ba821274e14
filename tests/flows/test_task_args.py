"""Task arguments are passed whole: Prefect neither walks into them nor loses the link between task runs."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

import flows.train as flows_train
from flows.run_report import stage_name
from flows.task_args import whole


class Counted(list):
    """A list that counts how often anything iterates it (Prefect's walk does; our tasks here do not)."""
    walks = 0

    def __iter__(self):
        Counted.walks += 1
        return super().__iter__()


@dataclass
class Held:
    items: Counted


_task = task(cache_policy=NO_CACHE, persist_result=False)


@_task
def make() -> Held:
    return Held(Counted(range(1000)))


@_task
def same(h: Held) -> Held:
    return h


@flow
def calls() -> dict:
    h = Held(Counted(range(1000)))
    Counted.walks = 0
    same(h)
    plain = Counted.walks
    Counted.walks = 0
    out = whole(same)(h)
    passed = Counted.walks
    named = flows_train._named(same, "select questions", 3)(h)  # the train flow's per-step calls
    made = whole(make)()
    whole(same)(made)
    return {"plain": plain, "whole": passed, "same_object": out is h and named is h, "after_named": Counted.walks}


def test_whole_arguments_are_not_walked_and_results_still_link_task_runs(prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    state = calls(return_state=True)
    got = state.result()
    assert got["plain"] >= 1  # Prefect walks a plain argument (twice, in Prefect 3.9)
    assert got["whole"] == 0 and got["after_named"] == 0 and got["same_object"]
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert stage_name("select questions", 3) in {r.name for r in runs}
    made = next(r for r in runs if r.name.startswith("make"))
    users = [r for r in runs if any(getattr(i, "id", None) == made.id for i in r.task_inputs.get("h", []))]
    assert len(users) == 1, {r.name: r.task_inputs for r in runs}
