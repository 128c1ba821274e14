"""Streamlit dashboard: `app.py` + `views/` pages over `queries.py` (read-only SQL) and `mlflow_reader.py`."""
