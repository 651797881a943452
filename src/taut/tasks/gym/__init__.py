"""The overthinking testbed: synthetic reasoning domains with an oracle for necessary length."""

from taut.tasks.gym.domains import ALL_DOMAINS, DOMAINS, HELD_OUT_DOMAINS, LEVELS, OPT_IN_DOMAINS, TRAINING_DOMAINS
from taut.tasks.gym.task import GymTask, TraceMixture, analyze

__all__ = ["ALL_DOMAINS", "DOMAINS", "OPT_IN_DOMAINS", "HELD_OUT_DOMAINS", "LEVELS", "TRAINING_DOMAINS",
           "GymTask", "TraceMixture", "analyze"]
