"""The verifiable reward: grading, what the grader saw, and grading stored trajectories again.

  grading   math-verify and final-letter grading in killable worker processes (r in {0, 1})
  audit     training's grading per row with what the grader read; the truncation rule
  reverify  `exgrpo reverify`: regrade a run's stored trajectories, report or apply disagreements
"""
