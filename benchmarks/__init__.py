"""Benchmarks: the measurements behind benchmarks/README.md, grouped by the question they answer.

    learning/      does ExGRPO learn faster than on-policy GRPO, and which of its parts matter?
    speed/         how fast is a training step, a decode, an evaluation, and where does the time go?
    scale/         does the experience database keep up at 10k-1M trajectories?
    reliability/   does a killed run resume exactly where an uninterrupted one ends?
    bench_record   the one helper every script writes its result record through (results/).

Each script runs as a file from the repository root, e.g.
`python benchmarks/learning/arith_compare.py --help`; results land in benchmarks/results/.
"""
