"""Every error kilnet raises on purpose is a KilnetError; the subclass says which stage refused."""


class KilnetError(Exception):
    """Base of all kilnet errors."""


class GraphError(KilnetError):
    """The graph is malformed: an unknown name, a bad attribute, a value from another graph."""


class ShapeError(KilnetError):
    """Shapes do not fit together: the message names the node, what it got and what it needs."""


class CompileError(KilnetError):
    """The graph could not be turned into a plan, or an OpenCL kernel failed to build."""


class FeedError(KilnetError):
    """Data handed to a compiled model (feeds, targets, parameters) does not fit it."""


class CheckpointError(KilnetError):
    """A .kiln file is unreadable, truncated, of another version, or of another architecture."""


class MemoryCheckError(KilnetError):
    """A kernel wrote outside its buffer: a guard region of a debug_buffers model changed."""


class BundleError(KilnetError):
    """An export bundle cannot be written (a bad argument or destination) or read (a missing or
    damaged file, a newer format version, a malformed plan)."""
