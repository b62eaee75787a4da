"""Credit-quality benchmark with exact ground truth (``leaf bench credit``).

``environment``: a tabular Markov policy with decision positions and an additive
reward; ``exact``: true values, advantages and policy gradient by dynamic programming;
``sampling``: K-response groups as ``RolloutBatch``; ``measures``: gradient cosine,
NMSE, token-credit correlation, forkability; ``learning``: policy-gradient runs;
``sweep``: the regimes and the report; ``plots``: PNG figures.
"""
