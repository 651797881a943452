"""taut: RL post-training that makes reasoning models think tightly — shorter chains of thought at
equal or higher accuracy. The command line is `taut` (taut.cli); README.md is the place to start."""
