"""Analyses of what training did to a model, as pure functions over float32 state dicts, run
directories and evaluation results: drift (``drift``), functional sparsity (``sparsity``),
localisation of the largest updates (``localisation``), robustness to compression (``compression``),
ES population diversity (``diversity``), the spread of the ES update estimate (``update_variance``)
and the sweep ablations (``ablations``). Weight loading is ``weights``; the re-evaluation adapter
``evaluator``; figures ``plots``. Each analysis module also draws its own ``evolm report`` section
(``report_section``), next to its computation. The ``evolm analyze`` verb (arguments, model loading,
measurement set-up) is ``evolm.commands.analyze``; measurements that perturb a model (diversity,
update variance) run in ``evolm.es.measure``. Nothing heavy is imported here.
"""
