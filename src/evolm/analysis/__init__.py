"""Analyses of what post-training did to a model (drift, sparsity, localisation, diversity, compression)."""
