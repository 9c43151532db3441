"""The op catalogue: importing this package imports each of its modules, which registers every
op (``kilnet.kernels.base.register``); the public builders are what the registry holds. Every
module here is an op; what ops are built from is kilnet/kernels/"""
import importlib
import pkgutil

from ..kernels.base import BUILDERS as _REGISTERED, Kernel, Op, Param, declared, get_op, register  # noqa: F401

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

BUILDERS = sorted(_REGISTERED)         # the package's own ops (an op registered later is not public)
globals().update({name: _REGISTERED[name] for name in BUILDERS})
__all__ = list(BUILDERS)
