"""ExGRPO dashboard: `exgrpo dashboard` runs `streamlit run dashboard/app.py` with the database and
MLflow of training in EXGRPO_DB_URL / MLFLOW_TRACKING_URI. Every page only reads."""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `dashboard` importable from a checkout

st.set_page_config(page_title="ExGRPO dashboard", page_icon=":material/replay:", layout="wide")
PAGES = [
    st.Page("views/runs.py", title="Runs", icon=":material/list:", url_path="runs"),
    st.Page("views/buffer.py", title="Buffer", icon=":material/inventory_2:", url_path="buffer"),
    st.Page("views/entropy.py", title="Entropy", icon=":material/bar_chart:", url_path="entropy"),
    st.Page("views/staleness.py", title="Staleness", icon=":material/history:", url_path="staleness"),
    st.Page("views/experience.py", title="Experience browser", icon=":material/search:", url_path="experience"),
    st.Page("views/results.py", title="Results", icon=":material/leaderboard:", url_path="results"),
    st.Page("views/what_if.py", title="Replay what-if", icon=":material/alt_route:", url_path="what_if"),
    st.Page("views/audit.py", title="Verifier audit", icon=":material/fact_check:", url_path="audit"),
    # the app's root URL (`/?run=ID` links) shows Runs too; a default page is served only at `/`, so Runs
    # itself is not the default, or `/runs` would be "Page not found"
    st.Page("views/runs.py", title="Runs", icon=":material/list:", url_path="home", default=True,
            visibility="hidden"),
]
page = st.navigation(PAGES)
st.session_state["page"] = page.url_path or "runs"  # namespaces page options' widget keys (`ui.option`)
page.run()
