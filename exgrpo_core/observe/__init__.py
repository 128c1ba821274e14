"""Watching a run's replay: health monitors and the staleness of replayed trajectories.

  monitors   each step's metrics checked against the `monitors` bounds
  staleness  replayed trajectories' age, importance weights w and f(w)
"""
