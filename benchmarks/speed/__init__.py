"""How fast is a training step, a decode, an evaluation, and where does the time go?

    trl_speed.py               seconds per step: TRL's GRPOTrainer against our on-policy and ExGRPO loops
    step_timing.py             seconds per iteration by stage, through the real Prefect flow
    orchestration_overhead.py  the share spent on Prefect, MLflow and database writes
    decode_speed.py            the decoders' sampling speed against the FLOP floor
    decode_ops.py              operator calls and host syncs per decode step, before / after
    eval_throughput.py         evaluation questions/s, samples/s, tokens/s
    train_speed.py             the train phase of real batches, old code against new
    malloc_reuse.py            run.malloc=reuse against glibc's defaults
    matmul_shapes.py           fp32 matmul rate at SmolLM2-135M's shapes
    gpu_step.py                one GPU iteration: stage split, decode tokens/s, MFU, peak memory
    flops_meter.py             FLOP accounting and the machine's matmul rate (a module)
    setup_trl.sh               installs TRL into benchmarks/.trl for trl_speed.py
"""
