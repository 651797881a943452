"""taut's length strategies inside other RL engines.

    taut.integrations.trl    reward functions and a length-cap callback for TRL's GRPOTrainer
                             (extra `taut[trl]`)
    taut.integrations.verl   an advantage estimator and a capped agent loop for verl, loaded
                             through verl's plugin mechanism (extra `taut[verl]`, own environment)

Importing this package imports neither engine: each module imports its engine when it is
itself imported. See docs/engines.md for launching multi-GPU runs with each.
"""
