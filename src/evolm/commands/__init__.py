"""The command-line layer: one module per verb, each defining ``register(subparsers)``.

(A placeholder until the verb registry lands; ``evolm.cli`` registers ``analyze`` and ``report`` from here.)
"""
