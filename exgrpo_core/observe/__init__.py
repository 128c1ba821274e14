"""Watching a run: health monitors, the staleness of replayed trajectories, host synchronisations.

  monitors   each step's metrics checked against the `monitors` bounds
  staleness  replayed trajectories' age, importance weights w and f(w)
  host_syncs counts the calls that make the host wait for the device (decode and training steps)
"""
