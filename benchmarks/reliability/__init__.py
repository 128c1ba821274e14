"""Does a run killed at random moments resume exactly where an uninterrupted run ends?

    fault_injection.py   SIGKILL a tiny `exgrpo train`, rerun until done, compare with an uninterrupted run
"""
