"""Evolution Strategies for LLM post-training.

Read in this order: ``noise.py`` (keys -> Gaussian noise), ``params.py`` (perturb / restore exactly /
apply an update on named tensors), ``shaping.py`` (fitness shaping), ``update.py`` (the ES update:
estimators, step scale, degenerate fitness), ``engine.py`` (the loop, run directory, resume).
"""
