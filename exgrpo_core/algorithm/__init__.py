"""The algorithm's pure rules (paper §3): numbers and tensors in, numbers and tensors out.

  advantages  group-relative advantages (Dr.GRPO form)
  losses      clipped on-policy term, shaped replay term, entropy, KL
  selection   bucket weights, question and trajectory selection
  sampler     seeded passes over the fresh questions
"""
