"""An MQL5 include (.mqh) for an export bundle: one class that runs the bundle's plan inside
MetaTrader 5 through MQL5's own OpenCL functions (``kilnet export BUNDLE --mql5 OUT.mqh``).

The class creates the context, the program (kernels.cl, compiled into the EX5 as a resource
string), one buffer per arena and one kernel per launch; sets every argument of every launch once
from the plan's table; loads the parameters (and state, and with a train bundle the optimizer
moments) from the bundle's .bin files under MQL5\\Files; and exposes ``Forward(in, out)`` and, for
a train bundle, ``TrainStep(in, target, loss)`` and ``Save(folder)``.

Offsets: kilnet kernels take every buffer as an arena pointer plus a separate ``uint`` element
offset argument, so each arena is one whole CL buffer bound with CLSetKernelArgMem (which takes a
buffer handle and no offset) and the offset is set with CLSetKernelArg as a ``uint``. Host reads and
writes use the byte offset argument of CLBufferWrite / CLBufferRead. No sub-buffers are needed.
kilnet kernels declare their local memory inside the kernel, so CLSetKernelArgMemLocal is not used.

MQL5 reference pages for every function the generated code calls (signatures checked there):
"""
import os
import re

from . import export as bundle_mod
from .errors import BundleError

REFERENCE = {
    "CLContextCreate": "https://www.mql5.com/en/docs/opencl/clcontextcreate",
    "CLProgramCreate": "https://www.mql5.com/en/docs/opencl/clprogramcreate",
    "CLKernelCreate": "https://www.mql5.com/en/docs/opencl/clkernelcreate",
    "CLBufferCreate": "https://www.mql5.com/en/docs/opencl/clbuffercreate",
    "CLSetKernelArgMem": "https://www.mql5.com/en/docs/opencl/clsetkernelargmem",
    "CLSetKernelArg": "https://www.mql5.com/en/docs/opencl/clsetkernelarg",
    "CLExecute": "https://www.mql5.com/en/docs/opencl/clexecute",
    "CLBufferWrite": "https://www.mql5.com/en/docs/opencl/clbufferwrite",
    "CLBufferRead": "https://www.mql5.com/en/docs/opencl/clbufferread",
    "CLKernelFree / CLBufferFree / CLProgramFree / CLContextFree":
        "https://www.mql5.com/en/docs/opencl",
    "#resource ... as string": "https://www.mql5.com/en/docs/runtime/resources",
    "FileOpen / FileReadArray / FileWriteArray": "https://www.mql5.com/en/docs/files",
}
__doc__ += "".join(f"\n    {k}: {v}" for k, v in REFERENCE.items()) + "\n"

MQL_TYPE = {"float32": "float", "float64": "double"}


def class_name(model):
    words = re.findall(r"[A-Za-z0-9]+", model) or ["model"]
    return "CKilnet" + "".join(w[:1].upper() + w[1:] for w in words)


def include(doc, stem):
    """The .mqh text for the bundle plan ``doc`` (plan.json as read by export.read); the program
    source is the resource ``<stem>.cl`` beside the .mqh. The same plan gives the same text."""
    T = MQL_TYPE[doc["dtype"]]
    item = 4 if T == "float" else 8
    cls = class_name(doc["model"])
    res = re.sub(r"\W", "_", stem).upper() + "_CL"
    arenas = {a["role"]: i for i, a in enumerate(doc["arenas"])}
    for a in doc["arenas"]:
        if a["bytes"] >= 2 ** 32:
            raise BundleError(f"mql5: arena {a['role']} needs {a['bytes']} bytes; MQL5's "
                              f"CLBufferCreate takes a uint size (below 4 GiB)")
    n_in = sum(r["count"] for r in doc["inputs"])
    n_out = sum(r["count"] for r in doc["outputs"])
    n_tg = sum(r["count"] for r in doc["targets"])
    train = "train_step" in doc["calls"]
    L = []
    w = L.append
    w("//+------------------------------------------------------------------+")
    w(f"//| {stem}.mqh: model '{doc['model']}' compiled by kilnet into {len(doc['launches'])} "
      f"OpenCL launches")
    w(f"//| (bundle format {doc['version']}, {doc['dtype']}, batch {doc['batch']}, "
      f"{doc['target']} kernel form{', with TrainStep' if train else ''}).")
    w("//| Generated: regenerate with `kilnet export BUNDLE --mql5 OUT.mqh`, do not edit.")
    w("//+------------------------------------------------------------------+")
    w("// MQL5 reference pages of the functions used here:")
    for k, v in REFERENCE.items():
        w(f"//   {k}: {v}")
    w("// Every kilnet kernel takes each buffer as (arena buffer, uint element offset): one CL")
    w("// buffer per arena, bound with CLSetKernelArgMem; the offset is a uint CLSetKernelArg.")
    w(f'#resource "{stem}.cl" as string {res}')
    w("")
    up = re.sub(r"\W", "_", cls).upper()
    w(f"#define {up}_BATCH {doc['batch']}")
    w(f"#define {up}_IN {n_in}      // elements of in[]: " +
      ", ".join(f"{r['name']} {r['shape']}" for r in doc["inputs"]))
    w(f"#define {up}_OUT {n_out}      // elements of out[]: " +
      ", ".join(f"{r['name']} {r['shape']}" for r in doc["outputs"]))
    if train:
        w(f"#define {up}_TARGET {n_tg}      // elements of target[]: " +
          ", ".join(f"{r['name']} {r['shape']}" for r in doc["targets"]))
    w("")
    w(f"class {cls}")
    w("  {")
    w("private:")
    w("   int               m_ctx;")
    w("   int               m_prog;")
    w(f"   int               m_mem[{len(doc['arenas'])}];    // one CL buffer per arena")
    w(f"   int               m_kern[{len(doc['launches'])}];   // one kernel per launch")
    w("   bool              Fail(const string what)")
    w("     {")
    w(f'      PrintFormat("{cls}: %s failed, error %d",what,GetLastError());')
    w("      return(false);")
    w("     }")
    w("   bool              Zero(const int i,const uint count)")
    w("     {")
    w(f"      {T} z[];")
    w("      ArrayResize(z,count);")
    w("      ArrayInitialize(z,0);")
    w('      return(CLBufferWrite(m_mem[i],z,0,0,count)==count || Fail("CLBufferWrite zeros"));')
    w("     }")
    w("   bool              Load(const int i,const string file,const uint count,const int common)")
    w("     {")
    w("      int h=FileOpen(file,FILE_READ|FILE_BIN|common);")
    w("      if(h==INVALID_HANDLE)")
    w('         return(Fail("FileOpen "+file));')
    w(f"      if(FileSize(h)!=(ulong)count*{item})")
    w("        {")
    w(f'         PrintFormat("{cls}: %s has %I64u bytes, needs %u",file,FileSize(h),count*{item});')
    w("         FileClose(h);")
    w("         return(false);")
    w("        }")
    w(f"      {T} data[];")
    w("      ArrayResize(data,count);")
    w("      uint n=FileReadArray(h,data,0,count);")
    w("      FileClose(h);")
    w("      if(n!=count)")
    w('         return(Fail("FileReadArray "+file));')
    w('      return(CLBufferWrite(m_mem[i],data,0,0,count)==count || Fail("CLBufferWrite "+file));')
    w("     }")
    w("   bool              Run(const int k,const uint dims,const uint g0,const uint g1,"
      "const uint g2,const uint l0,const uint l1,const uint l2)")
    w("     {")
    w("      uint off[],g[],l[];")
    w("      ArrayResize(off,dims);")
    w("      ArrayResize(g,dims);")
    w("      ArrayResize(l,dims);")
    w("      ArrayInitialize(off,0);")
    w("      g[0]=g0;")
    w("      l[0]=l0;")
    w("      if(dims>1) { g[1]=g1; l[1]=l1; }")
    w("      if(dims>2) { g[2]=g2; l[2]=l2; }")
    w("      bool ok=(l0>0) ? CLExecute(m_kern[k],dims,off,g,l) : CLExecute(m_kern[k],dims,off,g);")
    w('      return(ok || Fail("CLExecute of launch "+IntegerToString(k)));')
    w("     }")
    w("public:")
    if train:
        s = doc["step_scalars"]
        w("   double            lr;      // learning rate, read on every TrainStep")
        w("   ulong             step;    // train steps taken so far")
    w(f"   {cls}(void) : m_ctx(INVALID_HANDLE), m_prog(INVALID_HANDLE)"
      + (f", lr({s['config']['lr']!r}), step({s['step']})" if train else ""))
    w("     {")
    w("      ArrayInitialize(m_mem,INVALID_HANDLE);")
    w("      ArrayInitialize(m_kern,INVALID_HANDLE);")
    w("     }")
    w(f"                    ~{cls}(void) {{ Free(); }}")
    w("   //--- folder: the bundle's folder under MQL5\\Files (common: FILE_COMMON for the")
    w("   //--- terminals' common Files folder); device: CL_USE_ANY, CL_USE_GPU_ONLY, or an index")
    w("   bool              Init(const string folder,const bool common=false,"
      "const int device=CL_USE_ANY)")
    w("     {")
    w("      int fc=common ? FILE_COMMON : 0;")
    w("      m_ctx=CLContextCreate(device);")
    w("      if(m_ctx==INVALID_HANDLE)")
    w('         return(Fail("CLContextCreate"));')
    w("      string log;")
    w(f"      m_prog=CLProgramCreate(m_ctx,{res},log);")
    w("      if(m_prog==INVALID_HANDLE)")
    w("        {")
    w("         Print(log);")
    w('         return(Fail("CLProgramCreate"));')
    w("        }")
    w("      //--- arenas: one CL buffer each (size in bytes), zeros or the bundle's file")
    for i, a in enumerate(doc["arenas"]):
        w(f"      m_mem[{i}]=CLBufferCreate(m_ctx,{max(a['bytes'], item)},CL_MEM_READ_WRITE);"
          f"   // {a['role']}: {a['elements']} elements")
        w(f"      if(m_mem[{i}]==INVALID_HANDLE)")
        w(f'         return(Fail("CLBufferCreate {a["role"]}"));')
        if a["file"]:
            w(f'      if(!Load({i},folder+"\\\\{a["file"]}",{a["elements"]},fc))')
        else:
            w(f"      if(!Zero({i},{a['elements']}))")
        w("         return(false);")
    w("      //--- kernels: one per launch, so that each keeps its own arguments")
    for i, la in enumerate(doc["launches"]):
        w(f'      m_kern[{i}]=CLKernelCreate(m_prog,"{la["kernel"]}");   // launch {i}: {la["name"]}')
        w(f"      if(m_kern[{i}]==INVALID_HANDLE)")
        w(f'         return(Fail("CLKernelCreate {la["kernel"]}"));')
    w("      //--- arguments, set once: slot -> arena buffer, or slot -> uint element offset")
    for i, la in enumerate(doc["launches"]):
        w(f"      //--- launch {i}: {la['name']}")
        for a in la["args"]:
            if a["kind"] == "arena":
                w(f"      if(!CLSetKernelArgMem(m_kern[{i}],{a['slot']},m_mem[{arenas[a['arena']]}]))"
                  f"   // {a['name']} = {a['buffer']}")
            else:
                w(f"      if(!CLSetKernelArg(m_kern[{i}],{a['slot']},(uint){a['value']}))"
                  f"   // {a['name']}")
            w(f'         return(Fail("{la["name"]} slot {a["slot"]}"));')
    w("      return(true);")
    w("     }")

    def run(call):
        for i in doc["calls"][call]:
            la = doc["launches"][i]
            g = (la["global_size"] + [1, 1])[:3]
            loc = (la["local_size"] + [1, 1])[:3] if la["local_size"] else [0, 0, 0]
            w(f"      if(!Run({i},{len(la['global_size'])},{','.join(map(str, g))},"
              f"{','.join(map(str, loc))}))   // {la['name']}")
            w("         return(false);")

    def transfer(fn, regions, array):
        at = 0
        for r in regions:
            w(f"      if({fn}(m_mem[{arenas[r['arena']]}],{array},{r['offset'] * item},{at},"
              f"{r['count']})!={r['count']})   // {r['name']} {r['shape']}")
            w(f'         return(Fail("{fn} {r["name"]}"));')
            at += r["count"]

    w(f"   //--- in[]: {up}_IN elements (the whole batch; pad unused samples), out[]: {up}_OUT")
    w(f"   bool              Forward(const {T} &in[],{T} &out[])")
    w("     {")
    w(f"      if(ArraySize(in)!={n_in})")
    w(f'         return(Fail("Forward: in[] must hold {n_in} elements"));')
    transfer("CLBufferWrite", doc["inputs"], "in")
    run("forward")
    w(f"      ArrayResize(out,{n_out});")
    transfer("CLBufferRead", doc["outputs"], "out")
    w("      return(true);")
    w("     }")
    if train:
        s = doc["step_scalars"]
        c = s["config"]
        w("   //--- one training step on a whole batch; loss: its value before the update")
        w(f"   bool              TrainStep(const {T} &in[],const {T} &target[],double &loss)")
        w("     {")
        w(f"      if(ArraySize(in)!={n_in} || ArraySize(target)!={n_tg})")
        w(f'         return(Fail("TrainStep: in[] needs {n_in} and target[] {n_tg} elements"));')
        w("      //--- the per-step scalars: " + ", ".join(s["values"]) + "; t = this step's number")
        w("      double t=(double)(step+1);")
        w(f"      {T} sc[4];")
        w(f"      sc[0]=({T})lr;")
        if s["optimizer"] == "adam":
            w(f"      sc[1]=({T})(1.0-MathPow({c['b1']!r},t));")
            w(f"      sc[2]=({T})(1.0-MathPow({c['b2']!r},t));")
        else:
            w("      sc[1]=0;")
            w("      sc[2]=0;")
        w("      sc[3]=0;")
        w(f"      if(CLBufferWrite(m_mem[{arenas[s['arena']]}],sc,{s['offset'] * item},0,4)!=4)")
        w('         return(Fail("CLBufferWrite step scalars"));')
        transfer("CLBufferWrite", doc["inputs"], "in")
        transfer("CLBufferWrite", doc["targets"], "target")
        run("train_step")
        w("      loss=0;")
        for r in doc["loss"]["parts"]:
            w("        {")
            w(f"         {T} part[];")
            w(f"         ArrayResize(part,{r['count']});")
            w(f"         if(CLBufferRead(m_mem[{arenas[r['arena']]}],part,{r['offset'] * item},0,"
              f"{r['count']})!={r['count']})")
            w('            return(Fail("CLBufferRead loss"));')
            w(f"         for(int i=0; i<{r['count']}; i++)")
            w("            loss+=part[i];")
            w("        }")
        w("      step++;")
        w("      return(true);")
        w("     }")
    w("   //--- write the arenas the bundle stores (parameters, state, moments) to folder")
    w("   bool              Save(const string folder,const bool common=false)")
    w("     {")
    for i, a in enumerate(doc["arenas"]):
        if not a["file"]:
            continue
        w("        {")
        w(f"         {T} data[];")
        w(f"         ArrayResize(data,{a['elements']});")
        w(f"         if(CLBufferRead(m_mem[{i}],data,0,0,{a['elements']})!={a['elements']})")
        w(f'            return(Fail("CLBufferRead {a["role"]}"));')
        w(f'         int h=FileOpen(folder+"\\\\{a["file"]}",FILE_WRITE|FILE_BIN|(common ? FILE_COMMON : 0));')
        w("         if(h==INVALID_HANDLE)")
        w(f'            return(Fail("FileOpen {a["file"]}"));')
        w(f"         uint n=FileWriteArray(h,data,0,{a['elements']});")
        w("         FileClose(h);")
        w(f"         if(n!={a['elements']})")
        w(f'            return(Fail("FileWriteArray {a["file"]}"));')
        w("        }")
    w("      return(true);")
    w("     }")
    w("   void              Free(void)")
    w("     {")
    w("      for(int i=0; i<ArraySize(m_kern); i++)")
    w("         if(m_kern[i]!=INVALID_HANDLE) { CLKernelFree(m_kern[i]); m_kern[i]=INVALID_HANDLE; }")
    w("      for(int j=0; j<ArraySize(m_mem); j++)")
    w("         if(m_mem[j]!=INVALID_HANDLE) { CLBufferFree(m_mem[j]); m_mem[j]=INVALID_HANDLE; }")
    w("      if(m_prog!=INVALID_HANDLE) { CLProgramFree(m_prog); m_prog=INVALID_HANDLE; }")
    w("      if(m_ctx!=INVALID_HANDLE) { CLContextFree(m_ctx); m_ctx=INVALID_HANDLE; }")
    w("     }")
    w("  };")
    return "\r\n".join(L) + "\r\n"


def write(bundle, out):
    """Write ``out`` (.mqh) for the bundle folder ``bundle`` and, beside it, ``<stem>.cl`` (the
    bundle's kernels.cl in ASCII: its few non-ASCII characters are in comments and become '?')
    that the include compiles in as a resource, making its folder where needed. Returns the
    .mqh path."""
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out).endswith(".mqh"):
        raise BundleError(f"mql5: the include's path must end in .mqh, got {out!r}")
    out = os.path.abspath(os.fspath(out))
    if os.path.isdir(out):
        raise BundleError(f"mql5: {out} is a folder; give the .mqh file to write")
    doc = bundle_mod.read(bundle)
    stem = os.path.basename(out)[:-len(".mqh")]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stem):
        raise BundleError(f"mql5: the include's name {stem!r} may use letters, digits, _ . - only")
    text = include(doc, stem)
    try:          # MQL5/Include/<yours>/ need not exist yet
        os.makedirs(os.path.dirname(out), exist_ok=True)
    except OSError as e:
        raise BundleError(f"mql5: cannot make the folder of {out}: {e}") from None
    with open(os.path.join(bundle, doc["source"]), "rb") as f:
        cl = f.read().decode("utf-8").encode("ascii", "replace")
    for path, data in ((out[:-len(".mqh")] + ".cl", cl), (out, text.encode("ascii"))):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return out
