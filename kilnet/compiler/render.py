"""Rendering kernels from Jinja2 templates, with each layer's constants baked in.

Identical renders share one kernel (and one program build); each kernel is named after the first
launch that uses it, so the source a person reads says where it came from.
"""
import hashlib
import os
import re

import jinja2

from ..kernels.base import GUARD_ARG, TEMPLATES
from ..runtime import cachefile, program_text
from ..policy.vectors import vector_pieces, widest_vector


def _op_template(name):
    """A template an op brings in its own module (``Op.templates``) rather than templates/."""
    return TEMPLATES.get(name.removesuffix(".cl.j2"))


_env = jinja2.Environment(loader=jinja2.ChoiceLoader([jinja2.PackageLoader("kilnet", "templates"),
                                                      jinja2.FunctionLoader(_op_template)]),
                          undefined=jinja2.StrictUndefined, trim_blocks=False,
                          keep_trailing_newline=True)
_env.globals.update(vector_pieces=vector_pieces, widest_vector=widest_vector, GUARD_ARG=GUARD_ARG)

PLACEHOLDER = "__KILNET_KERNEL__"


class TemplateCache(jinja2.BytecodeCache):
    """Compiled templates on disk (in kilnet's cache folder), so that a process loads them
    instead of parsing every template again: lowering W1 at batch 64 took 0.87 s in a fresh
    process and 0.12 s once its templates were compiled (2-core EPYC). Jinja2 checks each
    entry against its template's source; a file is written whole or not at all."""

    def __init__(self, folder):
        self.folder = folder

    def _path(self, bucket):
        return os.path.join(self.folder, bucket.key + ".jinja")

    def load_bytecode(self, bucket):
        try:
            with open(self._path(bucket), "rb") as f:
                bucket.load_bytecode(f)
        except (OSError, ValueError, EOFError):
            bucket.reset()

    def dump_bytecode(self, bucket):
        cachefile.write(self._path(bucket), bucket.bytecode_to_string())


def use_cache(folder):
    """Keep compiled templates in ``folder`` (kilnet's cache folder, from the settings)."""
    path = os.path.join(folder, "templates")
    if getattr(_env.bytecode_cache, "folder", None) != path:
        _env.bytecode_cache = TemplateCache(path)


def header(ctype):
    return _env.get_template("common.cl.j2").module.header(ctype).strip() + "\n"


class KernelArg(str):
    """A kernel argument as templates see it: its name (``{{ a }}``) and its ``access``, which
    ``c.signature`` turns into ``const`` for a buffer the kernel only reads; "uint" or "real"
    for a by-value argument (runtime/abi.py)."""

    def __new__(cls, name, access):
        arg = super().__new__(cls, name)
        arg.access = access
        return arg


class KernelName(str):
    """The kernel's name as templates see it; ``member`` asks ``c.kernel`` for the body as a
    member of the plan kernel (a device function; compiler/plan_kernel.py) instead of a kernel;
    ``guarded`` (kernels.base.Kernel.guarded) for a body that returns at once where its argument
    GUARD_ARG (names.STEP_OK) is 0; ``hints``: a kernel whose work-items compute on vectors says
    so (``c.kernel(..., vector=V)``: vec_type_hint), as the CPU form does on the implementations
    of target.VECTOR_HINTS."""

    def __new__(cls, name, member=False, guarded=False, hints=False):
        kname = super().__new__(cls, name)
        kname.member, kname.guarded, kname.hints = member, guarded, hints
        kname.group, kname.locals = None, ()
        return kname

    def declare(self, group, locals):
        """What ``c.kernel`` says of the body: the work-group size it requires (it has barriers
        or local arrays), None if any will do, and its local arrays as (type, name, dims)."""
        self.group = tuple(group) if group else None
        self.locals = tuple((t, n, tuple(dims)) for t, n, dims in locals)
        return ""


def render(template, consts, names, access, member=False, guarded=False, hints=False):
    return render_declared(template, consts, names, access, member, guarded, hints)[0]


def render_declared(template, consts, names, access, member=False, guarded=False, hints=False):
    """(source, KernelName): the render and what its ``c.kernel`` declared."""
    args = [KernelArg(n, a) for n, a in zip(names, access)]
    kname = KernelName(PLACEHOLDER, member, guarded, hints)
    body = _env.get_template(f"{template}.cl.j2").render(kname=kname, args=args, **consts)
    # Drop the blank lines that Jinja's control blocks leave behind.
    return "\n".join(line for line in body.splitlines() if line.strip()) + "\n", kname


class Renderer:
    """Collects renders for one plan: kernel name per launch, source per kernel."""

    def __init__(self, ctype, hints=False):
        self.header = header(ctype)
        self.hints = hints         # KernelName.hints: the CPU form's vector hints
        self.sources = {}          # kernel name -> full program source
        self.renders = {}          # kernel name -> what it was rendered from (member)
        self._by_body = {}

    def kernel_for(self, launch_name, template, consts, names, access, guarded=False):
        body = render(template, consts, names, access, guarded=guarded, hints=self.hints)
        digest = hashlib.sha1(body.encode()).hexdigest()
        if digest not in self._by_body:
            kname = re.sub(r"\W", "_", launch_name)
            while kname in self.sources:
                kname += "_"
            self.sources[kname] = self.header + body.replace(PLACEHOLDER, kname)
            self._by_body[digest] = kname
            self.renders[kname] = (template, consts, names, access, guarded)
        return self._by_body[digest]

    def member(self, kname):
        """Kernel ``kname`` rendered as a member of the plan kernel: (a device function of the same
        name and body, without the header, which the plan kernel has once; the work-group size
        the body requires or None; its local arrays)."""
        template, consts, names, access, guarded = self.renders[kname]
        body, declared = render_declared(template, consts, names, access, True, guarded)
        return body.replace(PLACEHOLDER, kname), declared.group, declared.locals


def one_program(sources, kernels, ctype, rename=None, title=None):
    """``kernels`` (names in ``sources``, each a whole program starting with the common header)
    as the text of one program (runtime/program_text.py's ``one_program``, the header once at the
    top): what an export bundle's kernels.cl holds. A source that does not start with the header
    is a ValueError."""
    return program_text.one_program(sources, kernels, header(ctype), rename, title)
