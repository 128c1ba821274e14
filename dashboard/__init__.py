"""Streamlit dashboard (issue 3): `app.py` + `views/` pages over `queries.py` (read-only SQL) and `mlflow_reader.py`."""
