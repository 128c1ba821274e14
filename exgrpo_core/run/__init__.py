"""A run's lifecycle: open, resume, checkpoint, one process per run, children that die with it.

  session     everything a run holds in memory; open, resume (database rollback), checkpoint
  checkpoint  atomic, verified checkpoints: weights, optimiser, RNG, loop state; pruning
  locks       the one-process-per-run lock and a file lock for one-time creation
  lifeline    child processes that die with their parent (and the forkserver's preload)
  allocator   glibc malloc settings for CPU runs (`run.malloc`)
  reuse       `buffer.warm_start`: find and check earlier runs whose pools seed this one
"""
