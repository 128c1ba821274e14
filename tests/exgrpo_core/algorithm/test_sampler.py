"""Fresh-question order: seeded passes, exclusions, retired questions skipped while enough remain."""

from exgrpo_core.algorithm.sampler import FreshSampler


def test_one_pass_visits_every_question_once_in_seeded_order():
    uids = [f"q{i}" for i in range(10)]
    a, b = FreshSampler(uids, seed=3), FreshSampler(uids, seed=3)
    first = a.next(10, exclude=set(), retired=set(), skip_retired=True, min_remaining=0)
    assert sorted(first) == sorted(uids) and first == b.next(10, exclude=set(), retired=set(),
                                                             skip_retired=True, min_remaining=0)
    assert first != uids  # shuffled


def test_excluded_questions_are_not_drawn():
    s = FreshSampler([f"q{i}" for i in range(6)], seed=0)
    got = s.next(4, exclude={"q0", "q1"}, retired=set(), skip_retired=True, min_remaining=0)
    assert not {"q0", "q1"} & set(got) and len(got) == 4


def test_retired_questions_leave_the_next_pass_only_while_enough_remain():
    uids = [f"q{i}" for i in range(8)]
    s = FreshSampler(uids, seed=1)
    s.next(8, exclude=set(), retired=set(), skip_retired=True, min_remaining=0)
    second = s.next(5, exclude=set(), retired={"q0", "q1", "q2"}, skip_retired=True, min_remaining=4)
    assert not {"q0", "q1", "q2"} & set(second)
    t = FreshSampler(uids, seed=1)
    t.next(8, exclude=set(), retired=set(), skip_retired=True, min_remaining=0)
    few_left = t.next(8, exclude=set(), retired=set(uids[:6]), skip_retired=True, min_remaining=4)
    assert sorted(few_left) == sorted(uids)  # only 2 unretired < 4: keep sampling everything


def test_state_dict_resumes_the_same_sequence():
    uids = [f"q{i}" for i in range(7)]
    a = FreshSampler(uids, seed=5)
    a.next(3, exclude=set(), retired=set(), skip_retired=False, min_remaining=0)
    b = FreshSampler(uids, seed=5)
    b.load_state_dict(a.state_dict())
    kw = dict(exclude=set(), retired=set(), skip_retired=False, min_remaining=0)
    assert a.next(9, **kw) == b.next(9, **kw)
