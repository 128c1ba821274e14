"""ExGRPO dashboard: `exgrpo dashboard` runs `streamlit run dashboard/app.py` with the database and
MLflow of training in EXGRPO_DB_URL / MLFLOW_TRACKING_URI. Every page only reads."""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `dashboard` importable from a checkout

st.set_page_config(page_title="ExGRPO dashboard", page_icon=":material/replay:", layout="wide")
PAGES = [
    st.Page("views/runs.py", title="Runs", icon=":material/list:", url_path="runs", default=True),
    st.Page("views/buffer.py", title="Buffer", icon=":material/inventory_2:", url_path="buffer"),
    st.Page("views/entropy.py", title="Entropy", icon=":material/bar_chart:", url_path="entropy"),
    st.Page("views/experience.py", title="Experience browser", icon=":material/search:", url_path="experience"),
    st.Page("views/results.py", title="Results", icon=":material/leaderboard:", url_path="results"),
]
st.navigation(PAGES).run()
