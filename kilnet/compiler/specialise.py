"""Rendering kernels from Jinja2 templates, with each layer's constants baked in.

Identical renders share one kernel (and one program build); each kernel is named after the first
launch that uses it, so the source a person reads says where it came from.
"""
import hashlib
import re

import jinja2

from ..ops.base import TEMPLATES


def _op_template(name):
    """A template an op brings in its own module (``Op.templates``) rather than templates/."""
    return TEMPLATES.get(name.removesuffix(".cl.j2"))


_env = jinja2.Environment(loader=jinja2.ChoiceLoader([jinja2.PackageLoader("kilnet", "templates"),
                                                      jinja2.FunctionLoader(_op_template)]),
                          undefined=jinja2.StrictUndefined, trim_blocks=False,
                          keep_trailing_newline=True)

PLACEHOLDER = "__KILNET_KERNEL__"


def header(dtype):
    return _env.get_template("common.cl.j2").module.header(dtype).strip() + "\n"


class KernelArg(str):
    """A kernel argument as templates see it: its name (``{{ a }}``) and its ``access``, which
    ``c.signature`` turns into ``const`` for one the kernel only reads."""

    def __new__(cls, name, access):
        arg = super().__new__(cls, name)
        arg.access = access
        return arg


def render(template, consts, names, access):
    args = [KernelArg(n, a) for n, a in zip(names, access)]
    body = _env.get_template(f"{template}.cl.j2").render(kname=PLACEHOLDER, args=args, **consts)
    # Drop the blank lines that Jinja's control blocks leave behind.
    return "\n".join(line for line in body.splitlines() if line.strip()) + "\n"


class Specialiser:
    """Collects renders for one plan: kernel name per launch, source per kernel."""

    def __init__(self, dtype):
        self.header = header(dtype)
        self.sources = {}          # kernel name -> full program source
        self._by_body = {}

    def kernel_for(self, launch_name, template, consts, names, access):
        body = render(template, consts, names, access)
        digest = hashlib.sha1(body.encode()).hexdigest()
        if digest not in self._by_body:
            kname = re.sub(r"\W", "_", launch_name)
            while kname in self.sources:
                kname += "_"
            self.sources[kname] = self.header + body.replace(PLACEHOLDER, kname)
            self._by_body[digest] = kname
        return self._by_body[digest]
