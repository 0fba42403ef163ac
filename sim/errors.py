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


class ContractionConflict(Exception):
    """A float32 product the simulator fused into an add (one use so far) was used again.

    The compiler contracts only single-use products, so the launcher re-runs the lane group
    with the multiply at `site` (kernel file:line) kept unfused.
    """

    def __init__(self, site):
        super().__init__(site)
        self.site = site
