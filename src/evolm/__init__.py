"""evolm: post-train language models with Evolution Strategies on verifiable rewards, and measure
what ES and GRPO each do to a model (pass@k coverage, entropy, drift, sparsity, localisation)."""

__version__ = "0.1.0"
