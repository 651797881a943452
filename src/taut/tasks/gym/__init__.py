"""The overthinking testbed: synthetic reasoning domains with an oracle for necessary length."""

from taut.tasks.gym.domains import DOMAINS, HELD_OUT_DOMAINS, LEVELS, TRAINING_DOMAINS
from taut.tasks.gym.task import GymTask, TraceMixture, analyze

__all__ = ["DOMAINS", "HELD_OUT_DOMAINS", "LEVELS", "TRAINING_DOMAINS", "GymTask", "TraceMixture", "analyze"]
