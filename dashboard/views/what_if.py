"""Replay what-if: what another selection policy would have replayed from a run's stored pool, step by step and
without training, beside what the run replayed (exgrpo_core/store/what_if.py, docs/benchmarks/replay_lab.md).
The policy is re-run here on the read-only database, or read from a report `exgrpo replay-what-if` wrote."""

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import charts, db, ui
from dashboard import what_if_data as D

compute = st.cache_data(ttl=600, show_spinner="re-running the policy on the stored pool...")(D.compute)
run_replays = st.cache_data(ttl=600, show_spinner="loading the run's replays...")(D.run_replays)
reports_near = st.cache_data(ttl=ui.TTL_S, show_spinner="looking for reports...")(D.reports_near)
SOURCES = ["a policy, re-run now", "a report file"]
CHANGES_HELP = ("`key=value` lines, as `exgrpo replay-what-if --set` takes them: selection.* (mu, sigma, "
                "question_weighting, trajectory, age_half_life), buffer.max_age, buffer.replay_ratio. Empty: the "
                "run's own policy, drawn again with this seed.")


def render() -> None:
    st.title("Replay what-if")
    url = db.database_url()
    ui.sidebar(url)
    runs = ui.runs_or_stop(url)
    run = ui.pick_run(runs)
    if pd.isna(run.replay_started_step):
        why = ui.no_replay_reason(url, runs[runs["id"] == run.id]) or "replay never became active in this run"
        st.info(f"Run {run['name']} has replayed nothing: {why}. A what-if re-runs a selection policy at the steps "
                "a run replayed, so pick a run that replayed.")
        return
    row = D.ReadOnlyStore(db.readonly_engine(url)).get_run(run.id)
    source = st.radio("Compare the run with", SOURCES, horizontal=True, key=ui.option("source", SOURCES[0], SOURCES))
    ui.remember("source", source)
    report = from_policy(url, row) if source == SOURCES[0] else from_file(row)
    if report is None:
        return
    if report["run_id"] != run.id:
        st.warning(f"This report is of run {report['run_id'][:8]}, not of {run['name']} ({run.id[:8]}): pick that run "
                   "in the sidebar.")
        return
    show(report, run_replays(url, run.id), run["name"])


def from_policy(url: str, row: dict) -> dict | None:
    left, right = st.columns([3, 1])
    text = left.text_area("Policy changes (one `key=value` a line)", key=ui.option("changes", ""), help=CHANGES_HELP,
                          placeholder="selection.mu=0.25\nbuffer.max_age=8")
    ui.remember("changes", text)
    seed = int(right.number_input("seed of the draws", min_value=0, step=1, key=ui.option("seed", 0, parse=int)))
    ui.remember("seed", seed)
    changes = D.parse_changes(text)
    mine, theirs = D.policy_settings(D.policy(row["config"], [])), D.policy_settings(D.policy(row["config"], changes))
    with st.expander("The policies", expanded=bool(changes)):
        table = pd.DataFrame({"setting": list(mine), D.RUN: list(mine.values()), D.WHAT_IF: list(theirs.values())})
        st.dataframe(table, hide_index=True, width="stretch")
    return compute(url, row["id"], tuple(changes), seed)


def from_file(row: dict) -> dict | None:
    folder = D.run_folder(row["config"], row["name"])
    found = reports_near(folder, row["id"])
    pick = None
    if found:
        pick = st.selectbox(f"Reports of this run in `{folder}`", [p.name for p in found],
                            key=ui.option("report", found[0].name, [p.name for p in found]))
        ui.remember("report", pick)
    else:
        st.caption(f"No what-if report of this run in `{folder}` (write one with `exgrpo replay-what-if --config C "
                   f"--run {row['name']}`); give its path or upload it.")
    path = st.text_input("or a report's path", key=ui.option("path", ""))
    upload = st.file_uploader("or upload a report", type=["json"])
    if upload is not None:
        return D.read_report(upload.getvalue().decode("utf-8", errors="replace"), upload.name)
    if path.strip():
        return D.report_file(path.strip())
    if pick is not None:
        return D.report_file(folder / pick)
    st.info("Choose a report, give its path or upload one.")
    return None


def show(report: dict, actual: list[dict], name: str) -> None:
    if not report["steps"]:
        st.info(f"Run {name} has no step after replay switched on: there is nothing to re-run.")
        return
    first, last = report["steps"][0], report["steps"][-1]
    st.caption(f"Steps {first} to {last} of run {name}: the policy's draws on the pool rebuilt from the database "
               "(checked against the run's logged pool sizes), beside what the run replayed.")
    wi, ac = report["what_if"], report["actual"]
    cols = st.columns(4)
    cols[0].metric(f"replays, {D.WHAT_IF}", wi["replays"])
    cols[1].metric(f"replays, {D.RUN}", ac["replays"])
    for col, label, side in ((cols[2], D.WHAT_IF, wi), (cols[3], D.RUN, ac)):
        col.metric(f"gap to target, {label}", f"{D.total_gap(side, wi['target']):.3f}",
                   help="total variation between the replays' shares by source bucket and the target: 0 = on target")
    summary = D.summary_rows(report)
    st.dataframe(summary, hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="%.4g") for c in (D.WHAT_IF, D.RUN)})
    st.caption("Mean entropy: the what-if's is each chosen trajectory's entropy stored at collection; the run's is "
               "under the policy of the replaying step (a report written with `--rescore` scores both under one "
               "checkpoint).")

    st.subheader("Replays by source bucket against the target")
    buckets = D.bucket_rows(report)
    st.altair_chart(charts.replay_vs_target(buckets), width="stretch")
    table = buckets.pivot(index="k", columns="run", values="share").reindex(columns=[D.WHAT_IF, D.RUN]).fillna(0.0)
    table = table.assign(target=buckets.drop_duplicates("k").set_index("k")["target"]).reset_index()
    pct = st.column_config.NumberColumn(format="percent")
    st.dataframe(table.rename(columns={"k": "source bucket k"}), hide_index=True, width="stretch",
                 column_config={D.WHAT_IF: pct, D.RUN: pct, "target": pct})
    st.caption("A replayed question counts in the bucket it was drawn from (its latest k before the draw); the "
               "target is the what-if policy's weights w(k/K), normalised.")

    st.subheader("Per step: gap of the step's replays to the target")
    steps = D.per_step(report, actual)
    st.altair_chart(charts.lines(steps, "gap", "run", "total variation between a step's replays by bucket and the "
                                 "target", "gap"), width="stretch")
    with st.expander("Per step (table)", expanded=False):
        st.dataframe(steps, hide_index=True, width="stretch", column_config={
            "gap": st.column_config.NumberColumn(format="%.3f"),
            **{c: st.column_config.NumberColumn(format="%.4g") for c in D.RESCORED.values()}})
    st.caption("The run's gap is its logged `select/target_gap` when the what-if keeps the run's weights.")
    if D.rescored(report) is not None:
        rescore_part(report, steps)

    ages, ents = D.distributions(report, actual)
    left, right = st.columns(2)
    if ages.empty:
        left.info("No replay here carries a stored trajectory (prompt replay re-samples): no ages.")
    else:
        left.altair_chart(age_chart(ages), width="stretch")
    if ents.empty:
        right.info("No replayed trajectory here has an entropy.")
    else:
        right.altair_chart(entropy_chart(ents), width="stretch")


def rescore_part(report: dict, steps: pd.DataFrame) -> None:
    """A `--rescore` report: each side's replayed trajectories under the checkpoint, per step."""
    st.subheader("Per step: how far the policy has moved from the replays' behaviour")
    scored = steps.dropna(subset=["token log-ratio"])
    st.altair_chart(charts.lines(scored, "token log-ratio", "run", "mean token log pi / pi_behaviour of a step's "
                                 "replays under the checkpoint", "token log-ratio"), width="stretch")
    st.caption(f"Re-scored under {D.rescored_under(report)}: log-ratios against the stored behaviour log-probs "
               "(0: the policy that sampled them), the replay loss's weight per token (f(w) = w / (w + beta) with "
               "policy shaping), H(o) under the checkpoint beside the stored one, and the share of drawn questions "
               "whose lowest-entropy trajectory changes; the numbers are in the per-step table.")


def age_chart(ages: pd.DataFrame) -> alt.Chart:
    """Share of each side's replays per age (steps since the trajectory was sampled)."""
    order = [D.WHAT_IF, D.RUN]
    return alt.Chart(ages, title="replayed trajectories by age").mark_bar(opacity=0.8).encode(
        x=alt.X("age:O", title="age (steps since sampled)", axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("run:N", sort=order),
        y=alt.Y("share:Q", title="share of replays", axis=alt.Axis(format="%")),
        color=alt.Color("run:N", title=None, sort=order, scale=alt.Scale(scheme="tableau10")),
        tooltip=["run:N", "age:O", "replays:Q", alt.Tooltip("share:Q", format=".1%")]).properties(height=charts.HEIGHT)


def entropy_chart(ents: pd.DataFrame) -> alt.Chart:
    """Overlaid histograms of the replayed trajectories' entropy, one per side."""
    order = [D.WHAT_IF, D.RUN]
    return alt.Chart(ents, title="entropy of replayed trajectories").mark_bar(opacity=0.55, binSpacing=0).encode(
        x=alt.X("entropy:Q", bin=alt.Bin(maxbins=30), title="trajectory entropy H(o) (nats)"),
        y=alt.Y("count():Q", stack=None, title="replays"),
        color=alt.Color("run:N", title=None, sort=order, scale=alt.Scale(scheme="tableau10")),
        tooltip=["run:N", "count():Q"]).properties(height=charts.HEIGHT)


with ui.explained():
    render()
