"""The base of every configuration model: unknown keys are errors, assignments are validated,
and no float may be NaN or infinite (`lr: .inf` passes a `gt=0` bound)."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)
