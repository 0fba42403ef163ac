"""Exceptions the simulator raises. Each message names the block and kernel line when known."""


class SimulationError(RuntimeError):
    """The kernel did something a GPU would get wrong or leave undefined (checker finding)."""


class SimTypeError(TypeError):
    """A tile operation cuTile's compiler would reject (dtype/shape rules)."""


class SimNotSupported(NotImplementedError):
    """An op or argument the simulator cannot mirror exactly; it never approximates silently."""


class Divergence(Exception):
    """Raised inside a lane group when blocks disagree on a python-level decision.

    The launcher catches it, splits the group by `values` and re-runs each part.
    """

    def __init__(self, values, what):
        super().__init__(what)
        self.values = values
        self.what = what
