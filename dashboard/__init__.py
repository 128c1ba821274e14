"""Streamlit dashboard (issue 3); intentionally empty until then."""
