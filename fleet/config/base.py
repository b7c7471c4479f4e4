"""Base model shared by every config section: unknown keys are errors, attribute docstrings are the documentation."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section. `extra="forbid"` makes a misspelled key an error instead of a silently ignored value."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)
