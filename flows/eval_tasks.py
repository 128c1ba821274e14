"""Evaluation tasks shared by the training flow (periodic / final) and the evaluate flow.

`record` puts one evaluation everywhere it belongs: `eval_results` (save_eval, keyed by run id and
0-based step index), the step metrics and MLflow under `eval/<benchmark>/<metric>` (metrics.eval_key),
and the table / plot / samples files as MLflow artifacts under `eval/step_NNNNNN/`. What users read (the
MLflow step, N, the printed line) is the step number (metrics.step_number): the start model is step 0.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from exgrpo_core import metrics as M
from exgrpo_core.config.schema import ExGRPOConfig
from exgrpo_core.evaluation import evaluate as E, report as eval_report
from flows.run_report import stage_name
from flows.task_args import whole

_task = task(cache_policy=NO_CACHE, persist_result=False)
START_STEP = -1  # the step index an evaluation of the starting policy is stored at: step 0 (eval.at_start)


def load_items(cfg: ExGRPOConfig) -> list[E.EvalItem]:
    """The distinct questions of eval.suites (else data.eval_path), repeats grouped."""
    specs = cfg.eval.suites or ([cfg.data.eval_path] if cfg.data.eval_path else [])
    d = cfg.data
    return [it for spec in specs for it in E.load_suite(
        spec, question_key=d.question_key, answer_key=d.answer_key, system_prompt=d.system_prompt,
        instruction=d.instruction, max_questions=cfg.eval.max_questions, prompt_template=d.prompt_template)]


def generation_args(cfg: ExGRPOConfig) -> dict:
    """Plain arguments of `evaluation.evaluate_items` from the config (eval falls back to rollout)."""
    e = cfg.eval
    return dict(samples=e.samples, temperature=e.temperature, top_p=e.top_p,
                max_new_tokens=e.max_response_tokens or cfg.rollout.max_response_tokens,
                max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                batch_size=e.batch_size or cfg.rollout.generation_batch_size, seed=cfg.run.seed,
                pass_k=list(e.pass_k), require_think=cfg.reward.require_think,
                decode_streams=cfg.rollout.decode_streams, decode_matmul=cfg.rollout.decode_matmul)


class EvalProgress:
    """Progress lines of a running evaluation, `label: done/total questions, N s`: after a generated chunk
    (the `progress` callback of `generate_and_grade`) once `min_gap_s` passed since the last line, after the
    last chunk always, and every `every_s` seconds without one, so a long batch (cpu-demo evaluates its 78
    questions in one) is never silent and a 3-second evaluation is one line, not one per chunk."""

    def __init__(self, label: str, total: int, every_s: float = 30.0, min_gap_s: float = 5.0):
        self.label, self.total, self.every_s, self.min_gap_s = label, total, every_s, min_gap_s
        self.done, self.t0 = 0, time.perf_counter()
        self.said = self.t0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="eval-progress")

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if done >= total or time.perf_counter() - self.said >= self.min_gap_s:
            self.say()

    def say(self) -> None:
        self.said = time.perf_counter()
        print(f"{self.label}: {self.done}/{self.total} questions, {self.said - self.t0:.0f} s", flush=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            if time.perf_counter() - self.said >= self.every_s * 0.99:
                self.say()

    def __enter__(self) -> "EvalProgress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@_task
def run_eval(model, tokenizer, items: list[E.EvalItem], verify, args: dict, label: str = "eval") -> E.EvalReport:
    with EvalProgress(label, len(items)) as progress:
        return E.evaluate_items(model, tokenizer, items, verify, progress=progress, **args)


def flat_metrics(report: E.EvalReport) -> dict[str, float]:
    """{eval/<benchmark>/<metric>: value} plus the average, the ID / OOD averages and the evaluation's speed."""
    out = {M.eval_key(b, k): v for b, m in report.summary().items() for k, v in m.items()}
    out.update({M.eval_key(E.GROUP_AVERAGES[g], "pass@1"): v for g, v in report.group_averages().items()})
    out[M.EVAL_SECONDS] = report.seconds
    out[M.EVAL_QUESTIONS_PER_S] = len(report.questions) / report.seconds if report.seconds > 0 else 0.0
    return out


@_task
def record(report: E.EvalReport, *, store, run_id: str, step: int, tracker, out_dir: Path, label: str) -> dict:
    """Store, log and write one evaluation; returns its summary."""
    E.save_report(store, run_id, step, report)
    flat = flat_metrics(report)
    store.log_metrics(run_id, step, flat)
    tracker.log_metrics(flat, step)
    folder = Path(out_dir) / f"step_{M.step_number(step):06d}"
    eval_report.write_table({label: report.summary()}, folder)
    eval_report.write_samples(report, folder / "samples.jsonl")
    tracker.log_artifacts(folder, f"eval/{folder.name}")
    avg = report.average.get("pass@1", float("nan"))
    parts = ", ".join(f"{b} {100 * m['pass@1']:.1f}" for b, m in report.benchmarks.items())
    groups = "".join(f", {g.upper()} avg {100 * v:.1f}%" for g, v in report.group_averages().items())
    print(f"eval step {M.step_number(step)}: average pass@1 {100 * avg:.1f}%{groups} ({parts}) "
          f"in {report.seconds:.1f} s")
    return report.summary()


def stored_summary(store, run_id: str, step: int) -> dict | None:
    """The evaluation already stored for this step (a resumed run's final eval), as a summary."""
    rows = [r for r in store.get_evals(run_id) if r["step"] == step]
    return {r["benchmark"]: r["metrics"] for r in rows} or None


class TrainingEvaluator:
    """Periodic and final evaluation inside a training run (suites are loaded once, before the run opens)."""

    def __init__(self, cfg: ExGRPOConfig):
        self.cfg = cfg
        self.items = load_items(cfg)
        self.args = generation_args(cfg)

    def due(self, step: int) -> bool:
        every = self.cfg.eval.every
        return every > 0 and (step + 1) % every == 0

    def run(self, s, tracker, step: int) -> dict:
        """Evaluate the session's model now; sampling is spread over the run's processes (s.team)."""
        engine = s.team.engine_view(top_p=self.args["top_p"], batch_size=self.args["batch_size"],
                                    scores=False,  # tokens only (transformers engine): the same tokens
                                    sleep_after=False)  # (vLLM) no push comes between its chunks
        report = whole(run_eval.with_options(task_run_name=stage_name("evaluate", step)))(
            s.accelerator.unwrap_model(s.model), s.tokenizer, self.items, s.verify, {**self.args, "engine": engine},
            label=f"eval step {M.step_number(step)}")
        return whole(record.with_options(task_run_name=stage_name("record evaluation", step)))(
            report, store=s.store, run_id=s.run_id, step=step, tracker=tracker, out_dir=s.run_dir / "eval",
            label=self.cfg.run.name)

    def start(self, s, tracker) -> dict | None:
        """With eval.at_start: evaluate the starting policy once: step 0, stored at index -1."""
        if not self.cfg.eval.at_start or s.step != 0:
            return None
        return stored_summary(s.store, s.run_id, START_STEP) or self.run(s, tracker, START_STEP)

    def final(self, s, tracker) -> dict:
        """Evaluate at the last step unless that step's evaluation is already stored."""
        step = self.cfg.run.steps - 1
        return stored_summary(s.store, s.run_id, step) or self.run(s, tracker, step)
