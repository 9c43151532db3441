"""Every public name has a docstring (issue 48): the docs site's layer catalogue renders each op
module's docstring and its builders (``::: kilnet.ops.<module>``), and its API reference renders
``kilnet.__all__`` and ``kilnet.model.Model`` (mkdocstrings, Google style). A name added without
one, or a builder parameter added without an ``Args:`` entry, fails here with the list."""
import importlib
import inspect
import pkgutil
import re

import pytest

import kilnet as kn
import kilnet.ops
from kilnet.kernels.base import NOTES
from kilnet.model import Model


def own_doc(obj):
    """``obj``'s own docstring (not one inherited from a base class), stripped; '' if none."""
    return (obj.__doc__ or "").strip()     # a property's: its doc= or its getter's


def public_members(cls):
    """(name, member) for each public method, static/class method and property that ``cls``
    defines or inherits from a kilnet class (what mkdocstrings lists under the class; an
    override must have a docstring of its own, which mkdocstrings shows)."""
    seen = set()
    for klass in cls.__mro__:
        if klass is not cls and not klass.__module__.startswith("kilnet"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                yield name, member


def missing_docstrings(objects):
    """The dotted names, among ``objects`` ({name: module, class or function}) and the public
    members of every class among them, that have no docstring of their own."""
    missing = []
    for name, obj in objects.items():
        if not (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)):
            continue                 # plain data (kn.ACTIVATIONS): nothing to document here
        if not own_doc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            missing += [f"{name}.{m}" for m, member in public_members(obj) if not own_doc(member)]
    return sorted(missing)


def builder_doc(builder):
    """A builder's own docstring, without the module notes that kernels.base.register appends."""
    doc = builder.__doc__ or ""
    return doc.split(NOTES.format(module=builder.__module__))[0]


def undocumented_parameters(builder):
    """The parameters of ``builder``'s signature that its ``Args:`` section does not list (as
    ``name:``, ``name (type):``, ``*name:`` or ``**name:`` at the start of an entry), plus
    'Args:'/'Returns:' where a section is missing."""
    doc = inspect.cleandoc(builder_doc(builder))
    problems = [s for s in ("Args:", "Returns:") if not re.search(rf"^{s}\s*$", doc, re.M)]
    args = re.search(r"^Args:\s*\n((?:[ \t]+.*\n?|\s*\n)*)", doc, re.M)
    listed = set(re.findall(r"^[ \t]{4}\*{0,2}(\w+)(?: \([^)]*\))?:", args.group(1), re.M)) if args else set()
    problems += [p for p in inspect.signature(builder).parameters if p not in listed]
    return problems


def public_objects():
    objects = {f"kilnet.{name}": getattr(kn, name) for name in kn.__all__}
    objects["kilnet"] = kn
    objects["kilnet.model.Model"] = Model
    for module in pkgutil.iter_modules(kilnet.ops.__path__):
        objects[f"kilnet.ops.{module.name}"] = importlib.import_module(f"kilnet.ops.{module.name}")
    return objects


def test_every_public_name_has_a_docstring():
    missing = missing_docstrings(public_objects())
    assert not missing, "no docstring: " + ", ".join(missing)


def test_every_op_module_is_in_the_catalogue_check():
    modules = {name for name in public_objects() if name.startswith("kilnet.ops.")}
    assert len(modules) >= 24 and "kilnet.ops.dense" in modules and "kilnet.ops.shape_ops" in modules


@pytest.mark.parametrize("name", kn.BUILDERS)
def test_every_builder_documents_every_parameter(name):
    problems = undocumented_parameters(getattr(kn, name))
    assert not problems, f"kilnet.{name}: not in its docstring's Args/Returns: {problems}"


# -- the checkers themselves can fail ----------------------------------------------------------

class _Undocumented:
    def run(self):
        pass

    @property
    def size(self):
        return 1

    def _private(self):
        pass


class _Documented:
    """Has one."""

    def run(self):
        """Has one too."""

    @staticmethod
    def bare():
        pass


def _builder(x, units, *xs, activation=None, name=None):
    """A builder.

    Args:
        x: documented.
        units (int): documented.
        *xs: documented.
        name: documented.

    Returns:
        Value: documented.
    """


def _no_sections(x):
    """Mentions x, but in no Args section."""


def test_the_checker_reports_what_lacks_a_docstring():
    got = missing_docstrings({"m.Undocumented": _Undocumented, "m.Documented": _Documented,
                              "m.nothing": lambda: None, "m.data": (1, 2)})
    assert got == ["m.Documented.bare", "m.Undocumented", "m.Undocumented.run",
                   "m.Undocumented.size", "m.nothing"]


def test_the_checker_reports_an_undocumented_parameter():
    assert undocumented_parameters(_builder) == ["activation"]
    assert undocumented_parameters(_no_sections) == ["Args:", "Returns:", "x"]
