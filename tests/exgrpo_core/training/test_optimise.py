"""Training step: micro-batch accumulation is exact, oversized gradients skip the step, stats are sane."""

import copy
from functools import partial

import pytest
import torch
from accelerate import Accelerator

from exgrpo_core.algorithm import losses
from exgrpo_core.models.build import build_tiny_model, build_tiny_tokenizer
from exgrpo_core.training.batch import collate, micro_batch_rows
from exgrpo_core.training.optimise import optimise
from exgrpo_core.types import Rollout


def _setup(seed=0):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, seed=seed)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(6):
        resp = torch.randint(5, 40, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        rows.append(Rollout("q", [1, 7 + i, 9], resp, [-2.0] * len(resp), "", False, 0,
                            replayed_from=5 if i == 5 else None))
    batch = collate(rows, [1.0, -1.0, 0.5, -0.5, 0.0, 1.0], tok.pad_token_id, [0, 0, 0, 1, 1, 1])
    return model, batch


def _step(model, batch, micro, skip=None, lr=0.1, aggregation="seq_sum_norm", entropy_coef=0.001,
          entropy_micro_tokens=32768):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    acc = Accelerator(cpu=True)
    return optimise(model, opt, acc, batch, n_minibatches=1, micro_batch_size=micro,
                    onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
                    replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation=aggregation,
                    max_response_len=8, entropy_coef=entropy_coef, kl_coef=0.0, ref_model=None,
                    max_grad_norm=1e9, skip_grad_norm=skip, entropy_micro_tokens=entropy_micro_tokens)


def test_micro_batch_accumulation_equals_one_full_batch():
    model, batch = _setup()
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    sa, sb = _step(a, batch, micro=6), _step(b, batch, micro=1)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)
    assert abs(sa["loss/total"] - sb["loss/total"]) < 1e-6
    assert sa["loss/grad_norm"] > 0


def test_step_with_gradient_norm_above_threshold_is_skipped():
    model, batch = _setup()
    before = copy.deepcopy(model.state_dict())
    stats = _step(model, batch, micro=6, skip=1e-12)
    assert stats["loss/skipped_steps"] == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_step_changes_the_weights_and_reports_replay_tokens():
    model, batch = _setup()
    before = copy.deepcopy(model.state_dict())
    stats = _step(model, batch, micro=2)
    assert stats["loss/skipped_steps"] == 0 and stats["loss/optimizer_steps"] == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert stats["loss/replay_tokens"] == batch.response_mask[5].sum().item()


def test_length_ordered_micro_batches_cover_every_row_once_and_change_nothing():
    from exgrpo_core.training.batch import micro_batch_rows

    model, batch = _setup(seed=3)
    groups = micro_batch_rows(batch, 4)
    assert sorted(r for g in groups for r in g) == list(range(6)) and [len(g) for g in groups] == [4, 2]
    lengths = batch.attention_mask.sum(-1).tolist()
    assert max(lengths[r] for r in groups[0]) <= min(lengths[r] for r in groups[1])
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    sa, sb = _step(a, batch, micro=6), _step(b, batch, micro=4)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)
    assert abs(sa["loss/total"] - sb["loss/total"]) < 1e-6


def test_authors_aggregation_scales_the_policy_gradient_by_the_rows_and_sums_micro_batches():
    """micro_sum_norm (code): sum / max_len per micro-batch, summed; Dr.GRPO's divides by rows x max_len too."""
    from exgrpo_core.training import policy

    model, batch = _setup()
    dr = _step(copy.deepcopy(model), batch, micro=6, lr=0.0)
    whole = _step(copy.deepcopy(model), batch, micro=6, lr=0.0, aggregation="micro_sum_norm")
    split = _step(copy.deepcopy(model), batch, micro=2, lr=0.0, aggregation="micro_sum_norm")
    for key in ("loss/onpolicy", "loss/offpolicy"):  # 6 rows in the mini-batch
        assert whole[key] == pytest.approx(6 * dr[key], rel=1e-5) and split[key] == pytest.approx(whole[key], rel=1e-5)
    with torch.no_grad():  # the entropy term: a token mean per authors' micro-batch, summed over them
        _, ent = policy.token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, micro_batch_size=6,
                                                   score_mask=batch.response_mask)
    m = batch.response_mask
    assert dr["loss/entropy"] == pytest.approx(float(ent[m].sum()) / (6 * 8), rel=1e-4)
    assert len(micro_batch_rows(batch, 2)) == 3  # three memory micro-batches: the entropy term does not triple
    assert whole["loss/entropy"] == pytest.approx(float(ent[m].mean()), rel=1e-4)  # one 32k-token micro-batch
    assert split["loss/entropy"] == pytest.approx(whole["loss/entropy"], rel=1e-4)
    tokens = int(batch.attention_mask.sum())  # the authors' micro-batches of a third of the tokens: three means
    three = [_step(copy.deepcopy(model), batch, micro=n, lr=0.0, aggregation="micro_sum_norm",
                   entropy_micro_tokens=-(-tokens // 3))["loss/entropy"] for n in (6, 1)]
    assert three == pytest.approx([3 * float(ent[m].mean())] * 2, rel=1e-4)

def test_the_entropy_mean_counts_the_largest_micro_batch_count_of_any_process(monkeypatch):
    """(code) verl's dynamic batching takes the maximum micro-batch count over ranks: a process whose own
    tokens make one authors' micro-batch weighs its entropy as one of three when another process has three."""
    from exgrpo_core.training import optimise as O

    model, batch = _setup()
    asked = []
    monkeypatch.setattr(O.D, "all_reduce_max", lambda v: asked.append(v) or max(v, 3.0))

    def step(**kw):
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        return optimise(copy.deepcopy(model), opt, Accelerator(cpu=True), batch, n_minibatches=1, micro_batch_size=6,
                        onpolicy_term=partial(losses.clipped_ratio_term, clip_eps=0.2),
                        replay_term=partial(losses.shaped_replay_term, beta=0.1), aggregation="micro_sum_norm",
                        max_response_len=8, entropy_coef=0.001, kl_coef=0.0, ref_model=None, max_grad_norm=1e9,
                        skip_grad_norm=None, **kw)

    alone = step()["loss/entropy"]
    assert asked == []  # one process: no collective
    two = step(shard=(0, 2))  # this process holds half the rows: one authors' micro-batch of its own
    assert asked[0] == 1.0  # its own count, offered to the maximum
    mine = step(shard=(0, 2), entropy_micro_tokens=10**6)  # (the other process's count is 3 either way)
    assert two["loss/entropy"] == pytest.approx(mine["loss/entropy"], rel=1e-6)
    monkeypatch.setattr(O.D, "all_reduce_max", lambda v: v)  # as each process alone would count
    own = step(shard=(0, 2))["loss/entropy"]
    assert two["loss/entropy"] == pytest.approx(3 * own, rel=1e-5) and alone > 0
