"""The MQL5 include's members beyond the plan's table (tests/test_export.py checks that table):
the bounds checks Init runs before it sets any argument, Predict and the per-sample constants,
the stored arenas from arrays, the errors (Free on every failure path of Init, GetLastError and
the last OpenCL error), the float64 device choice, the kernel form (in the header, the note at
Init, and what --mql5 prints) and the step count that Save writes and Init reads back, in the
file and format of runner/kilnet_run.c. There is no MetaEditor here: the tests read the generated
text against plan.json, and a plan that puts an argument outside its arena is refused."""
import copy
import json
import os
import re
import shutil

import numpy as np
import pytest

import kilnet as kn
from kilnet.deploy import bundle as bundle_mod, bundle_read, mql5
from test_cli import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPIRALS = os.path.join(ROOT, "examples", "two_spirals.py")
MEMBER = re.compile(r"^   (?:bool|void|double|ulong|int|long) +~?\w+\(", re.M)


def two_inputs_graph():
    """Two inputs and two outputs (so that each has a nonzero place in sample[] and out[]),
    and a batchnorm (so that the bundle stores a state arena as well as the parameters)."""
    g = kn.Graph("two_in")
    a = g.input("a", (2, 3))
    b = g.input("b", (2, 2))
    g.output("y", kn.softmax(kn.dense(kn.concat(a, b), 4), heads=2))
    g.output("z", kn.dense(kn.batchnorm(a), 3, activation="tanh"))
    return g


def batch(rng, n=3):
    return ({"a": rng.normal(size=(n, 2, 3)), "b": rng.normal(size=(n, 2, 2))},
            {"y": rng.uniform(size=(n, 4)), "z": rng.normal(size=(n, 3))})


@pytest.fixture(scope="module")
def model():
    m = kn.compile(two_inputs_graph(), batch=3, optimizer=kn.Adam(lr=0.01),
                   loss={"y": "cross_entropy", "z": "mse"}, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(2):
        m.train_step(*batch(rng))
    return m


@pytest.fixture(scope="module")
def bundles(model, tmp_path_factory):
    """{name: (plan.json, the include's text with LF line ends)}: a train bundle of each kernel
    form, a forward-only bundle, and a float64 SGD train bundle."""
    root = tmp_path_factory.mktemp("mql5")
    out = {}
    f64 = kn.compile(two_inputs_graph(), batch=2, optimizer=kn.SGD(lr=0.1, momentum=0.9),
                     loss={"y": "cross_entropy", "z": "mse"}, dtype="float64", seed=2)
    f64.train_step(*batch(np.random.default_rng(3), 2))
    for name, m, kw in [("cpu", model, dict(target="cpu", train=True)),
                        ("gpu", model, dict(target="gpu", train=True)),
                        ("forward", model, dict(target="gpu")),
                        ("f64", f64, dict(target="cpu", train=True))]:
        path = m.export(root / name, **kw)
        made = mql5.write(path, str(root / "Include" / f"{name}.mqh"))
        with open(made, newline="") as f:
            raw = f.read()
        assert raw.isascii() and "\r\n" in raw and "\n" not in raw.replace("\r\n", "")
        out[name] = (bundle_read.read(path), raw.replace("\r\n", "\n"), path)
    return out


def member(text, name):
    """The text of the class member ``name`` (its declaration to the next member's)."""
    m = re.search(rf"^   (?:bool|void|double|ulong|int|long) +{name}\(", text, re.M)
    assert m, f"no member {name}"
    nxt = MEMBER.search(text, m.end())
    end = text.index("\n  };", m.end())
    return text[m.start():nxt.start() if nxt and nxt.start() < end else end]


def comment_above(text, name):
    """The //--- lines right above the class member ``name``."""
    start = member_at(text, name)
    lines = text[:start].split("\n")[:-1]
    above = []
    while lines and lines[-1].strip().startswith("//---"):
        above.insert(0, lines.pop())
    return "\n".join(above)


def member_at(text, name):
    return re.search(rf"^   (?:bool|void|double|ulong|int|long) +{name}\(", text, re.M).start()


def header_of(text, name):
    """The comment block before the program resource."""
    return text[:text.index(f'#resource "{name}.cl"')]


def code(text):
    """The text without comments and string literals (for counting braces and calls)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\])'", "''", text)
    return re.sub(r"//[^\n]*", "", text)


# -- bounds ------------------------------------------------------------------------------------
def bounds_of(doc):
    arena = {a["role"]: i for i, a in enumerate(doc["arenas"])}
    rows = []
    for k, la in enumerate(doc["launches"]):
        slots = {a["slot"]: a for a in la["args"]}
        for a in la["args"]:
            if a["kind"] == "arena":
                rows.append((k, la["name"], a["slot"], arena[a["arena"]],
                             slots[a["slot"] + 1]["value"], a["extent"]))
    return rows


@pytest.mark.parametrize("name", ["cpu", "gpu", "forward", "f64"])
def test_init_checks_every_arena_argument_before_setting_any(bundles, name):
    doc, text, _ = bundles[name]
    create = member(text, "Create")
    checks = re.findall(r'if\(!Inside\((\d+),"([^"]+)",(\d+),(\d+),(\d+),(\d+)\)\)', create)
    got = [(int(k), n, int(s), int(a), int(o), int(e)) for k, n, s, a, o, e in checks]
    assert got == bounds_of(doc) and got
    for k, _, slot, a, off, ext in got:          # the plan agrees: inside its arena
        assert off + ext <= doc["arenas"][a]["elements"]
    # after every buffer and kernel exists, before the first argument is set
    last_kernel = create.rindex("=CLKernelCreate(")
    assert last_kernel < create.index("Inside(") < create.index("CLSetKernelArg")
    assert create.rindex("Inside(") < create.index("CLSetKernelArg")
    # each check compares with the size of the CL buffer as created, read back, and names
    # the launch and the slot when it fails
    inside = member(text, "Inside")
    item = bundle_mod.DTYPES[doc["dtype"]].itemsize
    assert "CLGetInfoInteger(m_mem[a],CL_BUFFER_SIZE)" in inside
    assert f"(ulong)offset+extent<=(ulong)bytes/{item}" in inside
    assert 'launch %d (%s) slot %u' in inside and "return(false);" in inside


def test_a_plan_with_an_argument_outside_its_arena_is_refused(bundles, tmp_path):
    doc, text, path = bundles["cpu"]
    assert mql5.include(doc, "cpu") == text.replace("\n", "\r\n")
    k, la = next((k, la) for k, la in enumerate(doc["launches"])
                 if any(a["kind"] == "arena" and a["arena"] == "param" for a in la["args"]))
    arg = next(a for a in la["args"] if a["kind"] == "arena" and a["arena"] == "param")
    size = next(a["elements"] for a in doc["arenas"] if a["role"] == "param")
    offset = next(a for a in la["args"] if a["slot"] == arg["slot"] + 1)["value"]
    where = f"launch {la['name']} slot {arg['slot']}"
    # an extent one past the arena's end
    bad = copy.deepcopy(doc)
    next(a for a in bad["launches"][k]["args"] if a["slot"] == arg["slot"])["extent"] = \
        size - offset + 1
    with pytest.raises(kn.BundleError, match=re.escape(where) + r".*outside arena 'param'"):
        mql5.include(bad, "x")
    # an offset that moves it past the end
    bad = copy.deepcopy(doc)
    next(a for a in bad["launches"][k]["args"] if a["slot"] == arg["slot"] + 1)["value"] = size
    with pytest.raises(kn.BundleError, match=re.escape(where)):
        mql5.include(bad, "x")
    # no extent (a format 1 plan) or no offset argument after the arena
    bad = copy.deepcopy(doc)
    del next(a for a in bad["launches"][k]["args"] if a["slot"] == arg["slot"])["extent"]
    with pytest.raises(kn.BundleError, match="no extent.*export the bundle again"):
        mql5.include(bad, "x")
    bad = copy.deepcopy(doc)
    bad["launches"][k]["args"] = [a for a in bad["launches"][k]["args"]
                                  if a["slot"] != arg["slot"] + 1]
    with pytest.raises(kn.BundleError, match=re.escape(where) + ".*not its element offset"):
        mql5.include(bad, "x")
    # the same tampering in a copy of the bundle on disk: no include is written
    copied = tmp_path / "tampered"
    shutil.copytree(path, copied)
    plan = json.loads((copied / "plan.json").read_text())
    next(a for a in plan["launches"][k]["args"] if a["slot"] == arg["slot"])["extent"] = \
        size - offset + 1
    (copied / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(kn.BundleError, match="outside"):
        mql5.write(str(copied), str(tmp_path / "t.mqh"))
    assert not (tmp_path / "t.mqh").exists() and not (tmp_path / "t.cl").exists()


# -- one sample ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpu", "forward", "f64"])
def test_predict_takes_one_sample_as_row_0_of_a_zero_batch(bundles, name):
    doc, text, _ = bundles[name]
    up, n = "CKILNETTWOIN", doc["batch"]
    defines = dict(re.findall(r"^#define (\w+) (\S+)", text, re.M))
    for key, kind in (("inputs", "IN"), ("outputs", "OUT")):
        at = 0
        for r in doc[key]:
            assert r["shape"][0] == n and r["count"] % n == 0      # batch-major regions
            per = r["count"] // n
            assert defines[f"{up}_{kind}_{r['name'].upper()}_SAMPLE"] == str(per)
            assert defines[f"{up}_{kind}_{r['name'].upper()}_AT"] == str(at)
            assert re.search(rf"#define {up}_{kind}_{r['name'].upper()}_SAMPLE {per} .*"
                             rf"shape {re.escape(str(r['shape'][1:]))} per sample", text)
            at += per
        assert defines[f"{up}_SAMPLE_{kind}"] == str(at)
    predict = member(text, "Predict")
    s_in = int(defines[f"{up}_SAMPLE_IN"])
    n_in = sum(r["count"] for r in doc["inputs"])
    assert f"if(ArraySize(sample)!={s_in})" in predict
    # the whole batch: zeros, then the sample in row 0 of every input
    assert f"ArrayResize(in,{n_in});" in predict and "ArrayInitialize(in,0);" in predict
    def row_copies(dst, src):
        """(count, dst offset, src offset) of Predict's loops copying ``src`` into ``dst``."""
        found = re.findall(rf"for\(i=0; i<(\d+); i\+\+\)[^\n]*\n\s*{dst}\[(?:(\d+)\+)?i\]="
                           rf"{src}\[(?:(\d+)\+)?i\];", predict)
        return [(int(c), int(d or 0), int(s or 0)) for c, d, s in found]

    def rows(regions):
        """(per-sample count, offset in the sample, offset in the whole batch) per region."""
        out, at, batch_at = [], 0, 0
        for r in regions:
            out.append((r["count"] // n, at, batch_at))
            at, batch_at = at + r["count"] // n, batch_at + r["count"]
        return out
    assert row_copies("in", "sample") == [(c, b, a) for c, a, b in rows(doc["inputs"])]
    # Forward on it, and row 0 of every output back
    assert predict.index("ArrayInitialize(in,0);") < predict.index("if(!Forward(in,all))")
    assert row_copies("out", "all") == rows(doc["outputs"])
    assert f"ArrayResize(out,{defines[f'{up}_SAMPLE_OUT']});" in predict
    assert "batch is this sample and zeros" in comment_above(text, "Predict")   # documented
    # Forward's own writes and reads are untouched by it: the whole batch
    assert "Predict" not in member(text, "Forward")


# -- stored arenas from arrays ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["cpu", "forward", "f64"])
def test_every_stored_arena_can_be_set_from_an_array(bundles, name):
    doc, text, _ = bundles[name]
    T = mql5.MQL_TYPE[doc["dtype"]]
    stored = [(i, a) for i, a in enumerate(doc["arenas"]) if a["file"]]
    roles = {a["role"] for _, a in stored}
    assert {"param", "state"} <= roles
    assert ("moment1" in roles) == doc["train"]
    methods = re.findall(rf"bool +Set(\w+)\(const {T} &data\[\]\) \{{ return\(SetArena\((\d+),"
                         rf'"(\w+)",(\d+),data\)\); \}}', text)
    assert [(m, int(i), r, int(n)) for m, i, r, n in methods] == [
        (a["role"].title(), i, a["role"], a["elements"]) for i, a in stored]
    getters = re.findall(rf"bool +Get(\w+)\({T} &data\[\]\) \{{ return\(GetArena\((\d+),", text)
    assert [(m, int(i)) for m, i in getters] == [(a["role"].title(), i) for i, a in stored]
    set_arena = member(text, "SetArena")
    assert "if(ArraySize(data)!=count)" in set_arena and 'Ready("Set "+role)' in set_arena
    assert "CLBufferWrite(m_mem[i],data,0,0,count)==count" in set_arena   # the whole arena
    # Init("") reads no file: the stored arenas start as zeros, to be set from arrays
    create = member(text, "Create")
    for i, a in stored:
        assert (f'if(!(folder=="" ? Zero({i},{a["elements"]}) : '
                f'Load({i},folder+"\\\\{a["file"]}",{a["elements"]},fc)))') in create
    # the tester: the exact lines for the expert, and the resource way
    header = header_of(text, name)
    for _, a in stored:
        assert f'//   #property tester_file "{name}\\\\{a["file"]}"' in header
    assert f'#resource "param.bin" as {T} KnParam[]' in header and "net.SetParam(KnParam)" in header
    assert "FILE_COMMON" in header and "an include are ignored" in header


# -- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cpu", "forward", "f64"])
def test_init_frees_what_it_made_on_every_failure(bundles, name):
    _, text, _ = bundles[name]
    init = member(text, "Init")
    body = code(init)
    assert re.search(r"\{\s*Free\(\);\s*ResetLastError\(\);\s*if\(Create\(folder,common,device\)\)"
                     r"\s*return\(true\);\s*Free\(\);\s*return\(false\);\s*\}", body), init
    # Create stops at the first failure, returning false (Init then frees), and succeeds
    # only at its end
    create = code(member(text, "Create"))
    returns = re.findall(r"return\(([^;]*)\);", create)
    assert returns[-1] == "true" and returns.count("true") == 1
    assert all(r == "false" or r.startswith(("Fail(", "Refuse(")) for r in returns[:-1])
    assert create.count("return(") == create.count("return(false)") + \
        create.count("return(Fail(") + create.count("return(Refuse(") + 1
    # whatever Init made, Free releases and marks released
    free = member(text, "Free")
    for fn, handle in (("CLKernelFree", "m_kern[i]"), ("CLBufferFree", "m_mem[j]"),
                       ("CLProgramFree", "m_prog"), ("CLContextFree", "m_ctx")):
        assert f"{fn}({handle}); {handle}=INVALID_HANDLE;" in free
    assert "~CKilnetTwoIn(void) { Free(); }" in text


def test_errors_say_what_failed_with_both_error_codes(bundles):
    doc, text, _ = bundles["cpu"]
    fail = member(text, "Fail")
    # GetLastError first (the calls after it may change it), then the last OpenCL error and
    # its description, then reset for the next call
    at = [fail.index(s) for s in ("GetLastError()", "CLGetInfoInteger(0,CL_LAST_ERROR)",
                                  "CLGetInfoString(code,CL_ERROR_DESCRIPTION,text)",
                                  "PrintFormat(", "ResetLastError();")]
    assert at == sorted(at)
    # every public method that calls MQL5 resets the error first and checks Init came first
    for name in ("Forward", "TrainStep", "Save", "SetArena", "GetArena"):
        body = member(text, name)
        first_cl = re.search(r"\bCL[A-Z]\w+\(|\bWriteStep\(", body).start()
        assert body.index("ResetLastError();") < first_cl, name
        assert "Ready(" in body, name
    assert "Ready(" in member(text, "Predict")
    # and a wrong size is refused saying what is wanted
    assert re.search(r"Forward: in\[\] must hold \d+ elements, has %d", member(text, "Forward"))
    # every MQL5 function the include calls that is not the class's own is cited
    own = set(re.findall(r"^   (?:bool|void|double|ulong|int|long) +~?(\w+)\(", text, re.M))
    called = set(re.findall(r"\b([A-Z][A-Za-z0-9]+)\(", code(text))) - own - {
        "CKilnetTwoIn", "ArrayResize", "ArrayInitialize", "ArraySize", "Print", "PrintFormat",
        "FileClose", "FileSize", "MathPow", "MathMod", "MathFloor", "IntegerToString"}
    cited = set(re.findall(r"\b([A-Z][A-Za-z]+)\b", " ".join(mql5.REFERENCE)))
    assert called <= cited, called - cited
    for name in ("CLGetInfoInteger", "CLGetInfoString", "GetLastError", "ResetLastError",
                 "FileIsExist", "FileLoad", "FileSave"):
        assert name in called


# -- device -------------------------------------------------------------------------------------
def test_a_float64_bundle_takes_a_device_with_doubles_or_refuses(bundles):
    _, text, _ = bundles["f64"]
    create = member(text, "Create")
    # with CL_USE_ANY, a GPU with doubles first; else the device asked for
    assert re.search(r"if\(device==CL_USE_ANY\)\s*m_ctx=CLContextCreate\(CL_USE_GPU_DOUBLE_ONLY\);"
                     r"\s*if\(m_ctx==INVALID_HANDLE\)\s*\{\s*ResetLastError\(\);"
                     r"\s*m_ctx=CLContextCreate\(device\);", create)
    # whichever device it got: cl_khr_fp64, or a refusal saying so, before anything else
    check = create.index('StringFind(" "+ext+" "," cl_khr_fp64 ")<0')
    assert create.index("CLGetInfoString(m_ctx,CL_DEVICE_EXTENSIONS,ext)") < check
    assert check < create.index("CLProgramCreate(")
    assert "needs a device with doubles (cl_khr_fp64)" in create[check:]
    for name in ("cpu", "gpu", "forward"):              # float32: any device, no check
        other = member(bundles[name][1], "Create")
        assert "CL_USE_GPU_DOUBLE_ONLY" not in other and "cl_khr_fp64" not in other
        assert "m_ctx=CLContextCreate(device);" in other


# -- kernel form ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cpu", "gpu", "f64"])
def test_the_include_says_its_kernel_form_and_init_notes_another_device(bundles, name):
    doc, text, _ = bundles[name]
    form, other = doc["target"], {"cpu": "gpu", "gpu": "cpu"}[doc["target"]]
    header = header_of(text, name)
    assert f"{form} kernel form" in header and f"// Kernel form: {form}, the bundle's" in header
    assert f'#define CKILNETTWOIN_FORM "{form}"' in text
    if form == "cpu":
        assert "--target gpu" in header and "mostly on GPUs" in header
    create = member(text, "Create")
    note = re.search(rf"if\(type>=0 && type!=CL_DEVICE_{form.upper()}\)\s*PrintFormat\("
                     rf'"[^"]*note: the OpenCL device is %s[^"]*--target {other}[^"]*"', create)
    assert note, create
    assert "long type=CLGetInfoInteger(m_ctx,CL_DEVICE_TYPE);" in create
    assert "EnumToString((ENUM_CL_DEVICE_TYPE)type)" in create
    # a note, not a failure: nothing returns between it and the program
    between = create[note.end():create.index("CLProgramCreate(")]
    assert "return(" not in between


def test_mql5_says_which_form_it_wrote_and_why(capsys, tmp_path):
    out_dir = tmp_path / "spirals"
    code, out, err = run_cli(capsys, "export", SPIRALS, str(out_dir), "--target", "gpu",
                             "--mql5", str(tmp_path / "s.mqh"))
    assert code == 0, err
    assert re.search(r"wrote .*s\.mqh: gpu kernel form \(from --target gpu\), made for GPUs", out)
    code, out, err = run_cli(capsys, "export", SPIRALS, str(tmp_path / "own"), "--mql5",
                             str(tmp_path / "o.mqh"))
    assert code == 0, err
    form = bundle_read.read(tmp_path / "own")["target"]
    assert re.search(rf"wrote .*o\.mqh: {form} kernel form \(the form of the device the model "
                     rf"was compiled on, as --target was not given\)", out)
    if form == "cpu":
        assert "export the model with --target gpu" in out
    code, out, err = run_cli(capsys, "export", str(out_dir), "--mql5", str(tmp_path / "b.mqh"))
    assert code == 0, err
    assert re.search(r"wrote .*b\.mqh: gpu kernel form \(the bundle's\)", out)
    assert "Init prints a note when the device is not a GPU" in out


# -- resume -------------------------------------------------------------------------------------
def test_save_writes_the_step_count_and_init_continues_from_it(bundles):
    doc, text, _ = bundles["cpu"]
    step = doc["step_scalars"]["step"]
    assert step == 2 and mql5.STEP_FILE == "step.txt"
    # the export's count by default: constructed, and again at each Init before step.txt
    assert f"step({step})" in text
    create = member(text, "Create")
    assert create.index(f"step={step};") < create.index("CLContextCreate(")
    read = create.index('if(folder!="" && !ReadStep(folder+"\\\\step.txt",fc))')
    assert read > create.rindex("Load(") and read < create.index("CLKernelCreate(")
    # Save: the stored arenas, then step.txt in the same folder
    save = member(text, "Save")
    assert save.index('WriteStep(folder+"\\\\step.txt",fc)') > save.rindex("FileWriteArray(")
    # the format: one decimal line "N\n", what runner/kilnet_run.c writes ("%" PRIu64 "\n" to
    # OUTDIR/step.txt), so that a folder saved by either continues in both
    with open(os.path.join(ROOT, "runner", "kilnet_run.c"), encoding="utf-8") as f:
        runner = f.read()
    assert '"%s/step.txt"' in runner and '"%" PRIu64 "\\n"' in runner
    write = member(text, "WriteStep")
    assert "d[n]=(uchar)('0'+v%10);" in write and "b[i]=d[n-1-i];" in write
    assert "b[n]=(uchar)'\\n';" in write and "FileSave(file,b,common)" in write
    read_step = member(text, "ReadStep")
    assert "FileIsExist(file,common)" in read_step and "FileLoad(file,b,common)" in read_step
    assert "b[i]>='0' && b[i]<='9'" in read_step and "v=v*10+(ulong)(b[i]-'0');" in read_step
    assert "(b[i]=='\\n' && i+1==n)" in read_step and "(b[i]=='\\r' && i+2==n" in read_step
    assert "step=v;" in read_step
    # TrainStep counts on from it: t = step + 1, then step++
    train = member(text, "TrainStep")
    assert "double t=(double)(step+1);" in train and train.rindex("step++;") > train.rindex("Run(")
    # a non-finite loss (a NaN in in[] or target[]: the kernels' guard changed nothing) is
    # refused, and does not count as a step, as in Python and the C runner
    refuse = train.index("if(!MathIsValidNumber(loss))")
    assert train.rindex("loss+=part[i];") < refuse < train.rindex("step++;")
    assert "return(Refuse(" in train[refuse:train.rindex("step++;")]


def test_a_forward_only_include_has_no_step(bundles):
    doc, text, _ = bundles["forward"]
    assert not doc["train"]
    for word in ("TrainStep", "step.txt", "ReadStep", "WriteStep", "ulong             step"):
        assert word not in text, word


# -- the text as a whole ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cpu", "gpu", "forward", "f64"])
def test_the_include_is_balanced_and_deterministic(bundles, name):
    doc, text, _ = bundles[name]
    body = code(text)
    for a, b in ("{}", "()", "[]"):
        depth = 0
        for ch in body:
            depth += (ch == a) - (ch == b)
            assert depth >= 0
        assert depth == 0, (a, b)
    assert mql5.include(copy.deepcopy(doc), name) == text.replace("\n", "\r\n")
