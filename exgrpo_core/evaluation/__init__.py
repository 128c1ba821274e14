"""Benchmark evaluation (paper §4): suites, sampling and grading, pass@k, tables and plots.

  suites    shipped and hub suites, the benchmark table (name, in- or out-of-distribution)
  evaluate  load suites, generate and grade, score
  report    tables and plots of a report
"""
