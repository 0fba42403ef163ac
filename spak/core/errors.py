"""Errors shared by every kernel family."""


class ShapeError(ValueError):
    """A shape string outside a family's grammar (the message says why and what was expected)."""
