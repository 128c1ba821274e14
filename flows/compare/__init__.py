"""Comparisons and sweeps: arms x seeds (or a grid x seeds) as child runs, one table with statistics.

  flow      the `exgrpo-compare` flow: arms as child runs, nested MLflow runs, the report as artifacts
  arms      arm definitions, seeds, run names; equal rollout slots across arms
  report    the table and plots from the children's stored metrics; finished children read back
  stats     paired statistics against on_policy, Holm's correction, replays by bucket
  parallel  children as flow runs of the `exgrpo-train` deployment on a work pool (`--parallel`)
  sweep     the sweep flow: a grid x seeds as parallel children, one table
  grid      `--grid KEY=V1,V2` parsing and the children it makes
"""
