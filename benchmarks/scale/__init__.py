"""Does the experience database keep up at 10k-1M trajectories?

    db_scale.py            the store paths one training iteration uses, PostgreSQL and SQLite
    dashboard_queries.py   dashboard page query times on large databases
    monitor_queries.py     monitor banner and Staleness page query times
    synth_store.py         fills a database with a synthetic ExGRPO run (a module and a script)
    inmemory_baseline.py   the authors' in-memory buffer, the baseline db_scale.py times (a module)
"""
