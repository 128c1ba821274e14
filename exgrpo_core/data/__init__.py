"""Questions: where they come from and how they become prompts.

  questions  bundled sets, JSONL, Parquet (flat or verl), Hugging Face datasets -> Question; prompt ids
  arith      the generated two-digit arithmetic task (`gen:arith-<split>`)
  datasets/  the bundled question sets, evaluation suites and the tiny-sft weights
"""
