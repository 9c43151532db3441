"""The ``kilnet`` command: look at devices and at the kernels a model compiles to.

    kilnet devices
    kilnet inspect examples/two_spirals.py                     # calls build_model()
    kilnet inspect examples/two_spirals.py:build_model --kernel dense_1.forward
    kilnet inspect mypkg.models:make_graph --batch 32 --memory
    kilnet inspect examples/two_spirals.py --html report.html   # one self-contained HTML page
    kilnet bench [--steps N] [--device D]
    kilnet export examples/qnet.py qnet_bundle/ [--train] [--target cpu|gpu] [--mql5 qnet.mqh]
    kilnet export qnet.kiln --onnx qnet.onnx [--mql5-onnx qnet.mq5]   # inference graph as ONNX
    kilnet inspect qnet_bundle/                                # a bundle, as a model
    kilnet tune examples/qnet.py [--budget 120] [--only 'dense*,column_sum'] [--out T.json]
    kilnet tune qnet.kiln --batch 64                           # a checkpoint, at another batch

``inspect`` loads a Python file as a module (its ``if __name__ == "__main__"`` block does not
run) or imports ``package.module``, calls the named function (default ``build_model``) with no
arguments, and expects a compiled model or a ``kn.Graph`` (compiled for inference with
``--batch``, default 1). Every command that takes a model also takes a ``.kiln`` checkpoint, at
its own batch unless ``--batch`` says another; ``export`` loads one for inference (any batch,
even 1 with a batch norm) unless ``--train`` asks for the training call.
"""
import argparse
import importlib
import importlib.util
import os
import sys

import kilnet as kn

from . import tune
from .deploy import bundle, bundle_read, mql5, onnx
from . import report as html_report
from .errors import KilnetError
from .inspect import arg_list, kernel_table, memory_table
from .model import Model
from .runtime import icd
from .runtime.device import devices, select
from .runtime.progress import Progress
from .settings import read as read_settings

USAGE_ERROR = 2


class UsageError(Exception):
    """A bad argument: printed as ``kilnet: error: ...`` with exit status 2."""


# -- devices --------------------------------------------------------------------------------
def cmd_devices(args):
    if getattr(args, "register", False):        # Windows: the Khronos loader's registry key
        code, text = icd.register_system()
        print(text)
        return code
    rows = devices(check=True)
    if not rows:
        print("OpenCL reports no device")
        return 1
    head = ("id", "impl", "platform", "device", "type", "driver", "units", "memory", "local",
            "max wg", "fp64", "builds kernels")
    table = [head] + [(d["id"], d["implementation"], d["platform"], d["device"], d["type"],
                       d["driver"], str(d["compute_units"]), f"{d['global_mem_mb']} MiB",
                       f"{d['local_mem_kb']} KiB", str(d["max_work_group_size"]),
                       "yes" if d["fp64"] else "no", "yes" if d["builds"] is None else "NO")
                      for d in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for d in rows:
        if d["builds"] is not None:
            print(f"\ndevice {d['id']} ({d['implementation']}) cannot build kernels: {d['builds']}")
    chosen = read_settings().device
    print(f"\nKILNET_DEVICE={chosen!r}" if chosen else
          "\nKILNET_DEVICE is not set: models take the first GPU that builds kernels, else the best "
          "CPU implementation that does (intel, then pocl)")
    try:
        dev = select(None)
    except KilnetError as e:
        print(f"default device: none\n{e}")
        return 1
    ident = next(d["id"] for d in rows if d["device"] == dev.name.strip()
                 and d["platform"] == dev.platform.name.strip())
    print(f"default device: {ident} {dev.platform.name.strip()}: {dev.name.strip()}")
    return 0


# -- inspect --------------------------------------------------------------------------------
def _split_target(target):
    """'path.py', 'path.py:func', 'pkg.mod:func' -> (kind, where, function name)."""
    where, func = target, None
    head, sep, tail = target.rpartition(":")
    # "C:\\x.py" style drive letters are not a function separator.
    if sep and tail and "/" not in tail and "\\" not in tail and not (len(head) == 1 and head.isalpha()):
        where, func = head, tail
    if where.endswith(".py") or os.sep in where or "/" in where:
        return "file", where, func or "build_model"
    if not where or not all(part.isidentifier() for part in where.split(".")):
        raise UsageError(f"{target!r}: give a Python file (model.py, model.py:function) or a "
                         f"module (mypkg.models, mypkg.models:function)")
    return "module", where, func or "build_model"


def _load_file(path):
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    name = "_kilnet_inspect_" + "".join(c if c.isalnum() else "_" for c in
                                          os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)      # so the file can import its neighbours, as when run directly
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise UsageError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def _load_module(name):
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())     # as `python -m` does, so local packages import
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise UsageError(f"no module named {name!r} (is it installed or on PYTHONPATH?)") from None
        raise


def load_model(target, batch=1):
    """Resolve ``target`` to a compiled model (compiling a Graph for inference at ``batch``)."""
    kind, where, func = _split_target(target)
    module = _load_file(where) if kind == "file" else _load_module(where)
    fn = getattr(module, func, None)
    if fn is None:
        what = f"file {where}" if kind == "file" else f"module {where}"
        raise UsageError(f"{what} has no function {func!r}"
                         + (" (name one with FILE.py:FUNCTION)" if kind == "file" else ""))
    if not callable(fn):
        raise UsageError(f"{where}:{func} is not a function")
    result = fn()
    if isinstance(result, kn.Graph):
        return kn.compile(result, batch=batch)
    if isinstance(result, Model):
        return result
    raise UsageError(f"{where}:{func}() returned {type(result).__name__}; it must return a "
                     f"compiled model (kn.compile(...)) or a kn.Graph")


def cmd_inspect(args):
    if os.path.isdir(args.target):
        if args.html is not None:
            raise UsageError(f"--html needs a model (file.py, module:function or a .kiln "
                             f"checkpoint); {args.target} is an export bundle, which holds no "
                             f"compiled model to report on")
        return _inspect_bundle(args)
    _check_batch(args)
    if args.html is not None:
        try:                        # before compiling: a bad path costs nothing
            html_report.check_path(args.html)
        except kn.GraphError as e:
            raise UsageError(f"--html: {e}") from None
    model = _model_of(args.target, args.batch)
    if args.html is not None:
        path = html_report.report(model, args.html)
        print(f"wrote {path}: report of model {model.graph.name!r} ({len(model.kernels)} "
              f"launches, {len(model.plan.sources)} kernel sources)")
    pk = model.plan.plan_kernel
    if args.kernel and pk is not None and args.kernel == pk.name:
        print(f"// {pk.describe()}")
        print(model.source(pk.name))
    elif args.kernel:
        launch = next((la for la in model.kernels if args.kernel in (la.name, la.kernel)), None)
        if launch is None:
            raise UsageError(f"no launch named {args.kernel!r}; launches: "
                             f"{', '.join(la.name for la in model.kernels)}")
        print(f"// {launch.name}: kernel {launch.kernel}, global {launch.global_size}, "
              f"local {launch.local_size}")
        print("// args: " + arg_list(launch))
        print(model.source(args.kernel))
    if args.memory:
        if args.kernel:
            print()
        print(memory_table(model))
    if not (args.kernel or args.memory or args.html):
        print(model.summary())
        print()
        print(kernel_table(model))
    return 0


def _inspect_bundle(args):
    if not bundle_read.is_bundle(args.target):
        raise UsageError(f"{args.target} is a folder but not an export bundle (no plan.json)")
    doc = bundle_read.read(args.target)
    if args.kernel:
        try:
            launch, source = bundle_read.kernel_source(args.target, doc, args.kernel)
        except kn.BundleError as e:          # a name not there is a usage error, as for a model
            raise UsageError(str(e)) from None
        print(f"// {launch['name']}: kernel {launch['kernel']}, global {tuple(launch['global_size'])}, "
              f"local {tuple(launch['local_size']) if launch['local_size'] else None}")
        print("// args: " + ", ".join(
            f"{a['slot']}:{a['name']}={a['buffer'] if a['kind'] == 'arena' else a['value']}"
            for a in launch["args"]))
        print(source, end="")
    if args.memory:
        if args.kernel:
            print()
        print(bundle_read.memory_table(doc))
    if not (args.kernel or args.memory):
        print(bundle_read.summary(doc))
        print()
        print(bundle_read.kernel_table(doc))
    return 0


# -- export ---------------------------------------------------------------------------------
def cmd_export(args):
    if args.onnx is not None or args.mql5_onnx is not None:
        return _export_onnx(args)
    if args.out is None:
        if not bundle_read.is_bundle(args.target):
            raise UsageError("give the bundle folder to write: kilnet export MODEL OUT/ (or an "
                             "existing bundle folder with --mql5 OUT.mqh)")
        if not args.mql5:
            raise UsageError(f"{args.target} is a bundle already: add --mql5 OUT.mqh to write its "
                             f"MQL5 include")
        if args.form or args.train:
            raise UsageError("--target and --train apply when exporting a model, not to an "
                             "existing bundle")
        print(f"wrote {mql5.write(args.target, args.mql5)}: "
              f"{mql5.form_note(bundle_read.read(args.target, check_data=False))}")
        return 0
    _check_batch(args)
    if args.mql5 and not args.mql5.endswith(".mqh"):
        raise UsageError(f"--mql5 must name a .mqh file, got {args.mql5!r}")
    # On a terminal: "kilnet: exporting to OUT: 1 of 3 (writing the bundle)" while it works.
    steps = ["compiling the model", "writing the bundle", "checking the bundle"] + \
        (["writing the MQL5 include"] if args.mql5 else [])
    with Progress(len(steps), f"exporting to {args.out}", note=steps[0]) as progress:
        say = progress.wrap(print)
        model = _model_of(args.target, args.batch, inference=not args.train)
        progress.advance(note=steps[1])
        path = bundle.export(model, args.out, target=args.form, train=args.train)
        progress.advance(note=steps[2])
        doc = bundle_read.read(path, check_data=False)
        say(f"wrote bundle {path}: {len(doc['launches'])} launches, {len(doc['kernels'])} "
            f"kernels, calls {', '.join(doc['calls'])}")
        if args.mql5:
            progress.advance(note=steps[3])
            say(f"wrote {mql5.write(path, args.mql5)}: "
                f"{mql5.form_note(doc, 'target' if args.form else 'model')}")
    return 0


def _check_batch(args):
    if args.batch is not None and args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")


def _model_of(target, batch, inference=False):
    """A .kiln checkpoint (its own batch; ``batch`` only when given; ``inference``: compiled for
    forward alone, as ``kn.load(..., inference=True)``), or what load_model loads (a Graph at
    ``batch``, default 1)."""
    if target.endswith(".kiln"):
        if not os.path.isfile(target):
            raise UsageError(f"no such file: {target}")
        return kn.load(target, batch=batch, inference=inference)
    return load_model(target, batch=1 if batch is None else batch)


def _export_onnx(args):
    if args.onnx is None:
        raise UsageError("--mql5-onnx needs --onnx OUT.onnx (the script embeds that file)")
    if not args.onnx.endswith(".onnx"):
        raise UsageError(f"--onnx must name a .onnx file, got {args.onnx!r}")
    if bundle_read.is_bundle(args.target):
        raise UsageError(f"--onnx exports a model (file.py, module:function or a .kiln "
                         f"checkpoint); {args.target} is a bundle, which holds no graph")
    if args.mql5_onnx is not None and not args.mql5_onnx.endswith(".mq5"):
        raise UsageError(f"--mql5-onnx must name a .mq5 file, got {args.mql5_onnx!r}")
    _check_batch(args)
    steps = ["compiling the model"] + (["writing the bundle"] if args.out is not None else []) \
        + ["writing the ONNX file"] + (["writing the MQL5 script"] if args.mql5_onnx else [])
    with Progress(len(steps), f"exporting to {args.onnx}", note=steps[0]) as progress:
        say = progress.wrap(print)
        # ONNX is the inference graph; a bundle beside it trains where --train asks.
        model = _model_of(args.target, args.batch, inference=not (args.out and args.train))
        if args.out is not None:
            progress.advance(note="writing the bundle")
            path = bundle.export(model, args.out, target=args.form, train=args.train)
            say(f"wrote bundle {path}")
        progress.advance(note="writing the ONNX file")
        path = onnx.export_onnx(model, args.onnx)
        io = lambda d: ", ".join(f"{k} (N, {', '.join(map(str, n.shape))})" for k, n in d.items())  # noqa: E731
        say(f"wrote {path}: ONNX opset {onnx.OPSET} of model {model.graph.name!r} "
            f"({model.dtype}, inference); inputs {io(model.graph.inputs)}; outputs "
            f"{io(model.graph.outputs)}")
        if args.mql5_onnx is not None:
            progress.advance(note="writing the MQL5 script")
            say(f"wrote {onnx.write_mql5_script(model, path, args.mql5_onnx)}")
    return 0


# -- tune -----------------------------------------------------------------------------------
def cmd_tune(args):
    _check_batch(args)
    if not args.budget > 0:         # also refuses nan
        raise UsageError(f"--budget must be a number of seconds > 0, got {args.budget}")
    if args.only is not None and not [p for p in args.only.split(",") if p.strip()]:
        raise UsageError("--only needs launch names or families, e.g. --only 'dense*,gemm_vec'")
    if args.out and os.path.isdir(args.out):
        raise UsageError(f"--out must name a .json file, got the folder {args.out}")
    model = _model_of(args.target, args.batch)
    print(f"tuning {model!r} for {args.budget:g} s", file=sys.stderr, flush=True)
    result = tune.tune(model, budget=args.budget, only=args.only, path=args.out,
                       write=not args.dry_run, log=lambda line: print(line, file=sys.stderr,
                                                                      flush=True))
    print(result.report())
    if result.path:
        print(f"\nwrote {len(result.entries)} entries to {result.path} in {result.seconds:.0f} s "
              f"({len(result.dropped)} launches keep the policy's schedule: any entries of theirs "
              f"were removed)")
    else:
        print(f"\n{'dry run: ' if args.dry_run else ''}nothing written ({len(result.entries)} "
              f"entries found in {result.seconds:.0f} s)")
    return 0


# -- bench ----------------------------------------------------------------------------------
def cmd_bench(args):
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(os.getcwd(), "benchmarks", "train_step.py"),
                  os.path.join(os.path.dirname(here), "benchmarks", "train_step.py")]
    path = next((p for p in candidates if os.path.isfile(p)), None)
    if path is None:
        raise UsageError("benchmarks/train_step.py not found: run `kilnet bench` from a kilnet "
                         "source checkout")
    return _load_file(path).main(args.rest, prog="kilnet bench") or 0


# -- entry point ----------------------------------------------------------------------------
def parser():
    ap = argparse.ArgumentParser(prog="kilnet", description="kilnet: neural networks compiled into "
                                 "plans of specialised OpenCL kernels")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("devices", help="list the OpenCL devices kilnet can use")
    p.add_argument("--register", action="store_true",
                   help="Windows, as administrator: register Intel's CPU runtime under "
                        "HKLM\\SOFTWARE\\Khronos\\OpenCL\\Vendors, which elevated processes "
                        "read (elsewhere: says it is not needed)")
    p.set_defaults(func=cmd_devices)
    p = sub.add_parser("inspect", help="show the kernels, sources and memory of a model or bundle",
                       description="Load TARGET (file.py, file.py:function or module:function), call "
                                   "the function (default build_model) and show what the model "
                                   "compiles to.")
    p.add_argument("target", help="file.py or module (calls build_model), file.py:function, "
                   "module:function, a .kiln checkpoint, or an export bundle folder")
    p.add_argument("--kernel", metavar="NAME", help="print the OpenCL source of this launch "
                   "(e.g. dense_1.forward), or of the plan kernel (kl_plan), instead of the tables")
    p.add_argument("--memory", action="store_true", help="print the memory map (buffers, roles, offsets)")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report of the "
                   "compiled plan (graph, launches, arenas, sources) to PATH instead of the tables")
    graph_batch(p)
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("export", help="write a bundle that runs the model without Python "
                       "(kernels.cl, plan.json, raw parameters), and an MQL5 include",
                       description="Load TARGET as `inspect` does and write its compiled plan to "
                                   "the folder OUT (atomically). With an existing bundle as TARGET "
                                   "and no OUT, --mql5 writes the include for that bundle.")
    p.add_argument("target", help="file.py, file.py:function or module:function (as for inspect), "
                   "a .kiln checkpoint (loaded for inference unless --train), or a bundle folder")
    p.add_argument("out", nargs="?", help="the bundle folder to write")
    p.add_argument("--target", dest="form", choices=("cpu", "gpu"),
                   help="kernel form to export (default: the model's own)")
    p.add_argument("--train", action="store_true",
                   help="also the train_step call, the targets and the optimizer moments")
    p.add_argument("--mql5", metavar="OUT.mqh", help="also write an MQL5 include (and OUT.cl)")
    p.add_argument("--onnx", metavar="OUT.onnx", help="write the inference graph as ONNX (opset "
                   "17; TARGET may also be a .kiln checkpoint; OUT may then be left out)")
    p.add_argument("--mql5-onnx", metavar="OUT.mq5", help="with --onnx: also an MQL5 script, in "
                   "the .onnx file's folder, that embeds it and runs one prediction")
    graph_batch(p)
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("tune", help="time candidate launch schedules on the device and save the "
                       "fastest in its schedule table",
                       description="Load TARGET as `inspect` does (or a .kiln checkpoint), time "
                                   "candidate schedules of its launches (training and forward) "
                                   "against the policy's on the device, keep those that are faster "
                                   "beyond the noise and give the same results, and merge them "
                                   "into the device's schedule table (keyed by device and driver), "
                                   "which later compiles on that device read.")
    p.add_argument("target", help="file.py, file.py:function or module:function (as for inspect), "
                   "or a .kiln checkpoint")
    graph_batch(p)
    p.add_argument("--budget", type=float, default=tune.DEFAULT_BUDGET, metavar="SECONDS",
                   help=f"time to spend, the most expensive launches first (default "
                        f"{tune.DEFAULT_BUDGET:g})")
    p.add_argument("--only", metavar="PATTERNS", help="comma-separated launch names or families "
                   "to tune (shell patterns: 'dense*', 'gemm_vec'; default all)")
    p.add_argument("--out", metavar="TABLE.json", help="the table to merge into (default: "
                   "KILNET_SCHEDULES, else the device's table in the cache dir)")
    p.add_argument("--dry-run", action="store_true", help="measure and report; write nothing")
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser("bench", help="time train steps of the qnet example (benchmarks/train_step.py)",
                       description="Run benchmarks/train_step.py; other options (--device, --steps, "
                                   "--per-kernel, ...) are passed on to it: see its --help.",
                       add_help=False)
    p.set_defaults(func=cmd_bench)
    return ap


def graph_batch(p):
    """--batch of the commands that take a model (inspect, export, tune)."""
    p.add_argument("--batch", type=int, default=None,
                   help="batch to compile a returned kn.Graph for (default 1), or to load a "
                        "checkpoint at (default its own)")


def main(argv=None):
    ap = parser()
    args, rest = ap.parse_known_args(argv)
    if args.command == "bench":
        args.rest = rest
    elif rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args)
    except UsageError as e:
        ap.exit(USAGE_ERROR, f"kilnet: error: {e}\n")
    except KilnetError as e:
        ap.exit(1, f"kilnet: {type(e).__name__}: {e}\n")
    except BrokenPipeError:     # `kilnet inspect ... | head`
        sys.stderr.close()
        return 1


if __name__ == "__main__":
    sys.exit(main())
