"""Analyses of what training did to a model, as pure functions over float32 state dicts and
evaluation results: drift (``drift``), functional sparsity (``sparsity``), localisation of the
largest updates (``localisation``), robustness to compression (``compression``), ES population
diversity (``diversity``) and the sweep ablations and update-estimate spread (``ablations``).
Parameter categories shared with the ES engine live in ``categories``; weight loading in
``weights``; the re-evaluation adapter in ``evaluator``; figures in ``plots``; the ``evolm analyze``
verb in ``cli``. Measurements that perturb a model (diversity, update variance) run in
``evolm.es.measure``. Nothing heavy is imported here.
"""
