"""Analyses of what training did to a model, as pure functions over float32 state dicts and
evaluation results: drift (``drift``), functional sparsity (``sparsity``), localisation of the
largest updates (``localisation``), robustness to compression (``compression``) and ES population
diversity (``diversity``). Parameter categories shared with the ES engine live in ``categories``;
weight loading in ``weights``; the re-evaluation adapter in ``evaluator``; figures in ``plots``;
the ``evolm analyze`` verb in ``cli``. Nothing heavy is imported here.
"""
