"""Preloaded into multiprocessing's forkserver (`exgrpo_core.run.lifeline.FORKSERVER_PRELOAD`); import nowhere else.

The forkserver ends when the process that started it does (it was started by whichever of that
process's threads first needed it, so it polls rather than using PR_SET_PDEATHSIG), and every process it
forks gets PR_SET_PDEATHSIG tied to the forkserver's loop: the whole tree goes with the trainer.
"""

from __future__ import annotations

import os
import sys

from exgrpo_core.run import lifeline

SERVER = os.getpid()

if "multiprocessing.forkserver" in sys.modules and sys.argv[:1] == ["-c"]:  # really in a forkserver
    lifeline.die_with_parent()
    os.register_at_fork(after_in_child=lambda: lifeline.kill_on_parent_death(SERVER))
