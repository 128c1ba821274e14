"""Records that cross module boundaries (STYLE P8). Shapes are given per field.

Plain dataclasses of Python lists and numbers, except `TrainBatch` which holds tensors. The store
converts database rows to and from these; no other module sees a row or a session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Question:
    """One training or evaluation question.

    uid: stable id inside its dataset (row index or the dataset's own id).
    messages: chat messages [{"role": ..., "content": ...}] that form the prompt.
    answer: ground truth, as text (math-verify parses it).
    source: dataset / benchmark name (verl `data_source`).
    reward_style: the row's declared grading ("choice", "math"; verl `reward_model.style`, a flat row's
        `reward_style`); anything else lets the source decide (`rewards.grader_for`).
    """

    uid: str
    messages: tuple[dict, ...]
    answer: str
    source: str = "train"
    reward_style: str = ""
    prompt: str | None = None
    """The raw prompt text (data.prompt_template other than `chat`): tokenised as it is, with the
    tokenizer's own special tokens (BOS where it defines one), no chat template; None: `messages`
    go through the chat template."""
    info: str = ""
    """The dataset row's other fields as JSON (what a reward function of the user's reads, `plugins.row_of`)."""

    @property
    def text(self) -> str:
        """The user message (for display and search)."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "user"), "")


@dataclass
class Generation:
    """One sampled response as the rollout engine returns it.

    response_ids: [T] sampled token ids (EOS included when generated, no padding).
    logprobs: [T] sampler log-probs of the sampled tokens (at the sampling temperature).
    truncated: stopped by max_response_tokens instead of EOS.
    entropies: [T] entropy of the sampling distribution at each step (after temperature / top-p).
    """

    response_ids: list[int]
    logprobs: list[float]
    text: str
    truncated: bool
    entropies: list[float] = field(default_factory=list)


@dataclass
class Rollout:
    """A verified response of question `question_uid` at policy version `step`.

    prompt_ids: [P] prompt token ids; response_ids: [T].
    behaviour_logprobs: [T] log pi(o_t) under the trainer at temperature 1 when generated (docs/implementation_details.md).
    entropy: H(o), mean full-distribution entropy over the T response tokens (docs/implementation_details.md).
    reward: 1.0 correct / 0.0 otherwise (continuous rewards: any value in [0, 1]); reason: why (e.g.
        "correct", "wrong", "timeout", "no_answer", a reward function's own).
    replayed_from: id of the stored trajectory when this is a replayed experience, else None.
    """

    question_uid: str
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    text: str
    truncated: bool
    step: int
    reward: float = 0.0
    reason: str = "unverified"
    entropy: float = float("nan")
    replayed_from: int | None = None
    sampler_logprobs: list[float] | None = None
    """[T] the rollout engine's own log-probs when the trainer rescored the response (TIS), else None."""
    prediction: str | None = None
    """The final answer the grader extracted (None: none found, or not graded by `loop.verify`)."""
    gold: str | None = None
    """The gold answer as the grader read it (math: the LaTeX given to math-verify; choice: the label)."""
    verifier: str | None = None
    """Grader name, "math" or "choice" (None: not recorded); verifier_version: its rules' version."""
    verifier_version: str | None = None


@dataclass
class Experience:
    """A stored correct trajectory that may be replayed.

    id: database id. response_ids / behaviour_logprobs: [T]. step: policy version that generated it.
    entropy: H(o) when collected (selection recomputes it under the current policy).
    behaviour_logprobs / text: None when read without payload (`ExperienceStore.candidates(payload=False)`).
    """

    id: int
    question_uid: str
    response_ids: list[int]
    step: int
    entropy: float
    times_replayed: int = 0
    behaviour_logprobs: list[float] | None = None
    text: str | None = None
    reward: float = 1.0
    """Its stored reward (read with the payload; 1 for 0/1 rewards, any value in (0, 1] when continuous)."""


@dataclass
class GroupResult:
    """The verified group of one question at one step.

    rollouts: the fresh responses (K, or K-1 for an experiential question).
    replayed: 1 when a stored correct trajectory completes the mixed group (chosen after the buffer
    update), so k and size count it without it being a new rollout.
    """

    question_uid: str
    rollouts: list[Rollout]
    is_replay: bool = False
    replayed: int = 0
    bucket: int | None = None
    """Continuous rewards: the reward-spread bucket (`algorithm.spread.assign`), which is then k; None: 0/1
    rewards, k counts the correct responses."""

    @property
    def continuous(self) -> bool:
        return self.bucket is not None

    @property
    def k(self) -> int:
        """The group's bucket: number of correct responses (0/1 rewards), else its reward-spread bucket."""
        return self.bucket if self.bucket is not None else self.successes

    @property
    def successes(self) -> int:
        """Responses that count as a success (`succeeded`), the replayed one included (0/1 rewards)."""
        return sum(1 for r in self.rollouts if self.succeeded(r)) + (0 if self.continuous else self.replayed)

    def succeeded(self, r: Rollout) -> bool:
        """Collectable as experience: correct (reward > 0) for 0/1 rewards; above the mean of the group's
        fresh rewards when continuous (paper v2 §5.3 as docs/rewards.md reads it)."""
        if not self.continuous:
            return r.reward > 0
        return r.reward > sum(x.reward for x in self.rollouts) / len(self.rollouts)

    @property
    def solved(self) -> bool:
        """Retired when solved: every response correct (k == size); continuous: every fresh reward is 1."""
        if not self.continuous:
            return self.k == self.size
        return all(r.reward >= 1.0 for r in self.rollouts)

    @property
    def size(self) -> int:
        """Group size: fresh rollouts plus the replayed trajectory."""
        return len(self.rollouts) + self.replayed


@dataclass
class BufferState:
    """Snapshot of a run's experience pool (for metrics and sampling).

    buckets: {k: [question uids]} of unretired questions with at least one pooled trajectory (empty
    when read with `with_buckets=False`).
    bucket_counts: {k: n} over all questions seen in the run, k = 0..K (retired ones included at K).
    """

    buckets: dict[int, list[str]]
    bucket_counts: dict[int, int]
    pool_questions: int
    pool_trajectories: int
    retired_questions: int


@dataclass
class TrainBatch:
    """Right-padded sequences ready for the loss (N rows, L = P + T max length).

    input_ids: [N, L] long; attention_mask: [N, L] long.
    response_mask: [N, L] bool, True on response tokens (the positions whose log-probs are trained).
    advantages: [N] float, one per sequence.
    old_logprobs: [N, L] float, behaviour log-probs aligned with response_mask (0 elsewhere).
    is_replay: [N] bool, True for replayed trajectories (policy shaping applies).
    tis_weights: [N, L] float, truncated importance weight of each on-policy token (None: all 1).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    is_replay: torch.Tensor
    meta: dict = field(default_factory=dict)
    tis_weights: torch.Tensor | None = None


@dataclass
class BatchPlan:
    """The step's questions: `fresh` get K rollouts, `replay` get K-1 plus one stored trajectory.
    `replay_slots`: the experiential questions asked for (round(rho*B) once replay is on, else 0).
    Dynamic sampling adds its refills to `fresh` and lists the dropped fresh questions in `dropped`."""

    step: int
    fresh: list[str]
    replay: list[str]
    replay_slots: int = 0
    dropped: list[str] = field(default_factory=list)
    rounds: int = 0
