"""Prefect flows and the `exgrpo` CLI: orchestration and MLflow tracking around `exgrpo_core`."""
