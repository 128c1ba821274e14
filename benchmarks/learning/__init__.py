"""Does ExGRPO learn faster than on-policy GRPO, and which of its parts matter?

    arith_compare.py        on-policy GRPO, ExGRPO and the paper's ablations on arith-fast, many paired seeds
    pair_archives.py        pair two arms from different comparison archives, seed by seed
    lr_grid.py              the pre-registered grid: on_policy and exgrpo each at its own best learning rate
    lr_grid_report.py       its analysis (--final), the tuned-per-arm section on the cells' archives
    seed_archive.py         the per-seed archive that lets seeds add up across sessions (a module)
    warm_start_reuse.py     ExGRPO warm-started from a finished run's pool against a cold start
    learning_efficiency.py  on-policy GRPO against ExGRPO on cpu-demo
    smollm2_lr.py           the SmolLM2 confirmation's learning-rate sweep
    calibrate_arith.py      where RL starts on arith-fast, and seconds per iteration
    calibrate_cpu_demo.py   SmolLM2-135M-Instruct's starting accuracy per difficulty
"""
