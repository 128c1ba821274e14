"""Rows that share a prompt run it once (forward_parts.shared_prompt_logits): same values, same gradients.

Run: .venv/bin/python -m pytest tests/exgrpo_core/test_forward_parts.py -q
"""

import pytest
import torch
from torch.testing import assert_close
from transformers import LlamaConfig, LlamaForCausalLM

from exgrpo_core.training.forward_parts import can_share_prompts
from exgrpo_core.training.policy import token_logprobs_and_entropy


@pytest.fixture()
def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def _groups(left: bool):
    """Three questions (prompts of 5, 2 and 4 tokens) with 3, 1 and 2 responses of mixed lengths
    (one empty), shuffled; right- or left-padded rows and their response masks."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (5, 2, 4)]
    rows = [(0, 3), (1, 2), (0, 1), (2, 4), (0, 5), (2, 0)]  # (question, response length)
    seqs = [(prompts[q], torch.randint(0, 50, (t,), generator=g).tolist()) for q, t in rows]
    width = max(len(p) + len(r) for p, r in seqs) + 1
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    am, resp = torch.zeros_like(ids), torch.zeros(ids.shape, dtype=torch.bool)
    for i, (p, r) in enumerate(seqs):
        start = width - len(p) - len(r) if left else 0
        ids[i, start:start + len(p) + len(r)] = torch.tensor(p + r)
        am[i, start:start + len(p) + len(r)] = 1
        resp[i, start + len(p):start + len(p) + len(r)] = True
    return ids, am, resp


def _embedded_tokens(model, fn):
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, a, _o: seen.append(a[0].numel()))
    try:
        out = fn()
    finally:
        hook.remove()
    return out, sum(seen)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_shared_prompts_give_the_same_values_and_gradients(llama, left, temperature):
    ids, am, resp = _groups(left)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    results, grads, tokens = {}, {}, {}
    for share in (True, False):
        (lp, h), tokens[share] = _embedded_tokens(llama, lambda: token_logprobs_and_entropy(
            llama, ids, am, micro_batch_size=6, temperature=temperature, score_mask=resp, share_prompts=share))
        ((lp * w).sum() + (h * w.flip(1)).sum()).backward()
        results[share] = (lp.detach(), h.detach())
        grads[share] = [p.grad.clone() for p in llama.parameters()]
        llama.zero_grad(set_to_none=True)
    assert tokens[True] < tokens[False]  # the shared path ran (three prompt forwards, not six)
    for a, b in zip(results[True], results[False]):
        assert_close(a, b, atol=2e-5, rtol=1e-5)
    assert (results[True][0][~resp] == 0).all()
    for a, b in zip(grads[True], grads[False]):  # float32 rounding scales with the gradient (up to ~350 here)
        assert_close(a, b, atol=1e-6 * float(b.abs().max()), rtol=1e-4)


def test_distinct_prompts_take_the_plain_path(llama):
    ids, am, resp = _groups(False)
    keep = [0, 1, 3]  # one row per question
    _, tokens = _embedded_tokens(llama, lambda: token_logprobs_and_entropy(
        llama, ids[keep], am[keep], micro_batch_size=3, score_mask=resp[keep]))
    assert tokens == ids[keep].shape[0] * (int(am[keep].any(0).nonzero().max()) + 1)  # one forward of the grid


def test_not_shared_under_gradient_checkpointing_in_training(llama):
    assert can_share_prompts(llama)
    llama.gradient_checkpointing_enable()
    llama.train()
    assert not can_share_prompts(llama)
    llama.eval()
    assert can_share_prompts(llama)


def test_the_config_switch_reaches_the_trainer(tmp_path):
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run.session import open_session

    for on in (True, False):
        cfg = load_config("tiny", [f"run.output_dir={tmp_path / str(on)}", "run.resume=never",
                                   f"run.db_url=sqlite:///{tmp_path / f'{on}.db'}", f"train.share_prompt_forward={on}"])
        s = open_session(cfg)
        try:
            assert s.team.worker.share_prompts is on
        finally:
            s.close()


def _prefixed(prefix_len=6, seed=3):
    """Four questions whose prompts (7-9 tokens) open with the same `prefix_len` tokens, 2-3 responses
    each of 0-5 tokens, shuffled; right-padded rows, their response masks and question indices."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(0, 50, (prefix_len,), generator=g).tolist()
    prompts = [head + torch.randint(0, 50, (n,), generator=g).tolist() for n in (1, 3, 2, 2)]
    rows = [(0, 3), (1, 2), (2, 5), (0, 1), (3, 4), (1, 0), (2, 2), (0, 5), (3, 1), (1, 4)]
    seqs = [(q, prompts[q], torch.randint(0, 50, (t,), generator=g).tolist()) for q, t in rows]
    width = max(len(p) + len(r) for _, p, r in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    am, resp = torch.zeros_like(ids), torch.zeros(ids.shape, dtype=torch.bool)
    for i, (_, p, r) in enumerate(seqs):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        am[i, :len(p) + len(r)] = 1
        resp[i, len(p):len(p) + len(r)] = True
    return ids, am, resp, [q for q, _, _ in seqs]


def test_a_common_prefix_of_distinct_prompts_runs_once_with_the_same_values_and_gradients(llama):
    ids, am, resp, qidx = _prefixed()
    keep = [0, 1, 2, 4]  # one row per question: no prompt repeats, only the 6-token prefix is shared
    ids, am, resp = ids[keep], am[keep], resp[keep]
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    results, grads, tokens = {}, {}, {}
    for share in (True, False):
        (lp, h), tokens[share] = _embedded_tokens(llama, lambda: token_logprobs_and_entropy(
            llama, ids, am, micro_batch_size=4, score_mask=resp, share_prompts=share))
        ((lp * w).sum() + (h * w.flip(1)).sum()).backward()
        results[share] = (lp.detach(), h.detach())
        grads[share] = [p.grad.clone() for p in llama.parameters()]
        llama.zero_grad(set_to_none=True)
    assert tokens[True] < tokens[False]
    for a, b in zip(results[True], results[False]):
        assert_close(a, b, atol=2e-5, rtol=1e-5)
    for a, b in zip(grads[True], grads[False]):
        assert_close(a, b, atol=1e-6 * float(b.abs().max()), rtol=1e-4)


def _optimise(model, ids, am, resp, qidx, micro, share, aggregation="seq_sum_norm"):
    from functools import partial

    from accelerate import Accelerator

    from exgrpo_core.algorithm import losses
    from exgrpo_core.training.optimise import optimise
    from exgrpo_core.types import TrainBatch

    n = ids.shape[0]
    g = torch.Generator().manual_seed(5)
    batch = TrainBatch(input_ids=ids, attention_mask=am, response_mask=resp, advantages=torch.randn(n, generator=g),
                       old_logprobs=torch.where(resp, -3.0 + 0.1 * torch.randn(ids.shape, generator=g), 0.0),
                       is_replay=torch.tensor([i == 3 for i in range(n)]), meta={"question_index": qidx})
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return optimise(model, opt, Accelerator(cpu=True), batch, n_minibatches=1, micro_batch_size=micro,
                    onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
                    replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation=aggregation,
                    max_response_len=8, entropy_coef=0.01, kl_coef=0.0, ref_model=None, max_grad_norm=1e9,
                    skip_grad_norm=None, share_prompts=share)


@pytest.mark.parametrize("micro", [3, 2])  # 4 prompts in one group / in two groups of 2
def test_a_mini_batch_runs_its_prompts_once_for_all_micro_batches_with_the_same_step(llama, micro):
    """The prompt caches are computed before the micro-batches and differentiated once after them: the
    SGD step (lr 1, so the weight change is the gradient) equals the plain per-row forward's."""
    import copy

    ids, am, resp, qidx = _prefixed()
    start = copy.deepcopy(llama.state_dict())
    steps, stats, shapes = {}, {}, {}
    for share in (True, False):
        llama.load_state_dict(start)
        shapes[share] = []
        hook = llama.get_input_embeddings().register_forward_hook(
            lambda _m, a, _o: shapes[share].append(tuple(a[0].shape)))
        stats[share] = _optimise(llama, ids, am, resp, qidx, micro, share)
        hook.remove()
        steps[share] = {k: v - start[k] for k, v in llama.state_dict().items()}
    # the first group's prompts: their 5-token prefix once (prompts but their last token: 6-8 tokens),
    # then the first `micro` remainders (1-3 tokens) once, before its micro-batches
    assert shapes[True][:2] == [(1, 5), (micro, 3)]
    assert sum(a * b for a, b in shapes[True]) < sum(a * b for a, b in shapes[False])
    assert stats[True]["loss/total"] == pytest.approx(stats[False]["loss/total"], rel=1e-5, abs=1e-7)
    for k, b in steps[False].items():  # the step is read back from float32 weights: their rounding too
        assert_close(steps[True][k], b, atol=1e-6 * float(b.abs().max()) + 2.4e-7 * float(start[k].abs().max()),
                     rtol=1e-4, msg=k)
    assert any(float(v.abs().max()) > 0 for v in steps[True].values())


def test_prompt_groups_hold_at_most_size_distinct_prompts():
    from exgrpo_core.training.batch import prompt_groups

    a, b, c = (1, 2), (1, 3), (4,)
    assert prompt_groups([a, b, a, c, None], 2) == [[0, 1, 2, 4], [3]]
    assert prompt_groups([a, b, a, c], 3) == [[0, 1, 2, 3]]
    assert prompt_groups([a, b, c], 3, max_tokens=4) == [[0, 1], [2]]  # 2 prompts x 2 tokens fill the budget
    assert prompt_groups([None, None], 2) == [[0, 1]]


def test_authors_aggregation_keeps_its_micro_batches_when_prompts_would_regroup(llama):
    """micro_sum_norm gives each micro-batch its own denominator, so rows are not regrouped by prompt."""
    from exgrpo_core.training.batch import micro_batch_rows
    from exgrpo_core.training.optimise import _micro_plan
    from exgrpo_core.types import TrainBatch

    ids, am, resp, qidx = _prefixed()
    n = ids.shape[0]
    batch = TrainBatch(input_ids=ids, attention_mask=am, response_mask=resp, advantages=torch.zeros(n),
                       old_logprobs=torch.zeros(ids.shape), is_replay=torch.zeros(n, dtype=torch.bool),
                       meta={"question_index": qidx})
    llama.train()
    assert [r for r, _ in _micro_plan(llama, batch, 2, None, True, regroup=False)] == micro_batch_rows(batch, 2)
    regrouped = _micro_plan(llama, batch, 2, None, True)
    assert [r for r, _ in regrouped] != micro_batch_rows(batch, 2)
    assert sorted(sum((r for r, _ in regrouped), [])) == list(range(n))
    assert [len(set(p)) for _, p in regrouped if p is not None] == [2, 2]


def test_scoring_without_grad_runs_every_prompt_once_across_micro_batches(llama):
    ids, am, resp, _ = _prefixed()
    out, shapes = {}, {}
    for share in (True, False):
        shapes[share] = []
        hook = llama.get_input_embeddings().register_forward_hook(
            lambda _m, a, _o: shapes[share].append(tuple(a[0].shape)))
        with torch.no_grad():
            out[share] = token_logprobs_and_entropy(llama, ids, am, micro_batch_size=4, score_mask=resp,
                                                    share_prompts=share)
        hook.remove()
    assert shapes[True][:2] == [(1, 5), (4, 3)] and len(shapes[True]) == 2 + 3  # prompts once, 3 micro-batches
    for a, b in zip(out[True], out[False]):
        assert_close(a, b, atol=2e-5, rtol=1e-5)
