"""mamba4cast_embedding: the Mamba4Cast input embedding, a composite of existing ops.

x (U, C), times (U,) -> (U, width):

    concat(batchnorm(conv1d(x, width − E, window=1, activation="tanh")),
           time_encoding(x, times, periods, freqs)),

freqs = ⌈(width/2)/(2·len(periods))⌉, E = 2·freqs·len(periods) (docs/DESIGN.md §2; docs/ARTICLES.md,
Mamba4Cast). Built inside ``graph.block("mamba4cast_embedding", name)``, so the parameters are
``<block>.conv1d_1.weight``/``bias``, ``<block>.batchnorm_1.gamma``/``beta`` (state
``running_mean``/``running_var``) and ``<block>.time_encoding_1.weight``/``bias``.

``streaming`` (not in docs/DESIGN.md's signature; default None) is passed to the batch norm:
None is the minibatch batch norm that docs/DESIGN.md's formula names; an int B gives the articles'
per-sample exponential-window batch norm (what the articles' Mamba4Cast layer runs), which
also trains at batch 1. The articles' position encoder code is not published (docs/ARTICLES.md);
the time features follow docs/DESIGN.md's ``time_encoding``.
"""
import math

from ..errors import ShapeError
from ..graph import graph_of
from ..kernels.base import register
from .batchnorm import batchnorm
from .concat import concat
from .conv1d import conv1d
from .time_encoding import check_periods, time_encoding


@register
def mamba4cast_embedding(x, times, width, periods, streaming=None, name=None):
    """(U, C), (U,) -> (U, width): tanh projection + batch norm, joined with time features.

    Args:
        x (Value): the input, (units U, channels C) per sample.
        times (Value): (U,) per sample: each unit's timestamp in seconds.
        width (int): output channels, at least 2·len(periods) + 1.
        periods (list[float]): a non-empty list of positive finite periods, in seconds.
        streaming (int | None): passed to the batch norm: None (default) the minibatch batch
            norm, an int B >= 1 the articles' per-sample window of B samples.
        name (str | None): the block's name, an ASCII identifier; default
            ``mamba4cast_embedding_<n>``. Its
            nodes are ``<name>.<node>`` and their parameters ``<name>.<node>.<param>``.

    Returns:
        value (Value): (U, width) per sample: width − E projected channels, then E time features.

    Raises:
        GraphError: periods is not a non-empty list of positive numbers, a bad ``streaming``,
            ``x`` or ``times`` is not a graph value, or ``name`` is not an ASCII identifier or
            is already used.
        ShapeError: width is not a positive int or too small for the time features, x is not
            (units, channels), or times is not (U,).
    """
    g = graph_of(x, "mamba4cast_embedding")
    what = "mamba4cast_embedding" + (f" {name!r}" if name is not None else "")
    periods = check_periods(periods, what)
    ok = isinstance(width, int) and not isinstance(width, bool)
    if not ok and hasattr(width, "dtype") and getattr(width, "shape", None) == ():
        width, ok = width.item(), isinstance(width.item(), int)
    if not ok or width < 1:
        raise ShapeError(f"{what}: width must be a positive int, got {width!r}")
    freqs = math.ceil((width / 2) / (2 * len(periods)))
    E = 2 * freqs * len(periods)
    if width - E < 1:
        raise ShapeError(f"{what}: width {width} is too small for the time features: "
                         f"{len(periods)} period(s) take E = 2·freqs·len(periods) = {E} channels "
                         f"(freqs = {freqs}), which leaves width − E = {width - E} < 1 for the "
                         f"projection; width must be at least {2 * len(periods) + 1} (2·len(periods) + 1)")
    with g.block("mamba4cast_embedding", name):
        h = batchnorm(conv1d(x, width - E, window=1, activation="tanh"), streaming=streaming)
        return concat(h, time_encoding(x, times, periods, freqs))
