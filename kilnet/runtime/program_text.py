"""The text of one OpenCL program that holds several kernels' sources, each rendered as a whole
program of its own: an export bundle's kernels.cl (compiler/render.py) and the programs that
runtime/program.py builds together on runtimes that pay a fixed cost a program."""
import re

_DEFINE = re.compile(r"^\s*#define\s+(\w+)", re.M)


def macros(body):
    """The names a rendered body ``#define``s, in order, each once: the plan kernel and an
    export bundle ``#undef`` them after the body, so that one body's macros do not reach the
    next. Each must begin its line (as the preprocessor requires); one that does not would be
    missed, so it is refused."""
    names = _DEFINE.findall(body)
    if len(names) != body.count("#define"):
        raise AssertionError(f"a #define that does not begin its line in:\n{body}")
    return list(dict.fromkeys(names))


# File-scope names a kernel's source may declare besides the kernel: inline helper functions and
# typedefs (a line starting at column 0).
_FILE_SCOPE = re.compile(r"^(?:(?:static\s+)?inline\s+[\w\s\*]*?\b(\w+)\s*\(|"
                         r"typedef\s+[\w\s\*]+?\b(\w+)\s*;)", re.M)


def one_program(sources, kernels, head, rename=None, title=None):
    """``kernels`` (names in ``sources``, each a whole program) as the text of one program: the
    common header once at the top; a kernel renamed (``rename``: {name: new name}) in its
    declaration only; macros a kernel #defines #undef'd after it; a file-scope helper function
    or typedef declared identically before (on one line) dropped, declared differently renamed
    within that kernel. ``head`` is the text every source starts with, put once at the top
    ("": none; then each source whole, a typedef it repeats dropped, its macros #undef'd after
    it); a source that does not start with it is a ValueError."""
    rename = rename or {}
    declared = {}                      # file-scope name -> its declaration line
    parts = ([f"/* {title}. */\n"] if title else []) + [head]
    for k in kernels:
        src = sources[k]
        if not src.startswith(head):
            raise ValueError(f"kernel {k} does not start with the program header")
        body = src[len(head):]
        new = rename.get(k, k)
        if new != k:
            body = re.sub(rf"\b{re.escape(k)}(\s*\()", new + r"\1", body, count=1)
        kept, clashes = [], []
        for line in body.splitlines(keepends=True):
            m = _FILE_SCOPE.match(line)
            if m:
                name = m.group(1) or m.group(2)
                if name not in declared:
                    declared[name] = line
                elif declared[name] == line and line.rstrip().endswith(("}", ";")):
                    continue                    # the same one-line declaration is in scope
                else:
                    clashes.append(name)
            kept.append(line)
        body = "".join(kept)
        for name in clashes:
            body = re.sub(rf"\b{re.escape(name)}\b", f"{name}_{new}", body)
        undef = "".join(f"#undef {d}\n" for d in macros(body))
        parts.append(f"/* ---- kernel {new} ---- */\n{body}{undef}")
    return "".join(parts)
