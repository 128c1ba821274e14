"""ExGRPO as a library: config, data, rewards, rollout, experience store, selection, losses, training.

No Prefect, MLflow or Streamlit imports here (STYLE P1); `flows/` composes these pieces.
"""

__version__ = "0.1.0"
