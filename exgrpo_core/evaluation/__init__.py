"""Benchmark evaluation (paper §4): suites, sampling and grading, pass@k, tables and plots.

  evaluate  load suites, generate and grade, score
  report    tables and plots of a report
"""
