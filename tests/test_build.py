"""Build checks: the headers compile cleanly as C99, C++ and CUDA; the
examples build with the command in their first comment; GPU code has no
register spills; no header uses C++ templates, classes or the STL."""
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import tempfile

from fa import ROOT, STATUS
from harness import case, test, Skip

WARN = ["-O2", "-Wall", "-Wextra", "-pedantic", "-Werror"]
TU = '#define FLASHATTN_IMPLEMENTATION\n#include "flashattn.h"\n' \
     '#define FLASHATTN_REF_IMPLEMENTATION\n#include "flashattn_ref.h"\n' \
     'int main(void) { return fa_cpu_forward(0, 0) == FA_OK; }\n'


def compile_source(compiler, flags, source, suffix):
    if not shutil.which(compiler[0]):
        raise Skip(f"{compiler[0]} not found")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tu" + suffix)
        with open(path, "w") as f:
            f.write(source)
        cmd = compiler + flags + ["-I", ROOT, path, "-o", os.path.join(tmp, "a.out"), "-lm"]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        assert out.returncode == 0 and not out.stderr.strip(), " ".join(cmd) + "\n" + out.stderr


case("build_c99_strict", compile_source, ["gcc"], ["-std=c99"] + WARN + ["-pthread"], TU, ".c")
case("build_c99_no_threads", compile_source, ["gcc"],
     ["-std=c99", "-DFA_NO_THREADS"] + WARN, TU, ".c")
case("build_cxx_strict", compile_source, ["g++"], ["-std=c++11"] + WARN + ["-pthread"], TU,
     ".cpp")
for isa, flags in (("avx2", ["-mavx2", "-mfma"]), ("avx512", ["-mavx2", "-mfma", "-mavx512f"])):
    case(f"build_c99_strict_{isa}", compile_source, ["gcc"], ["-std=c99"] + flags + WARN +
         ["-pthread"], TU, ".c")
case("build_nvcc_host", compile_source, ["nvcc"], ["-Xcompiler", "-Wall,-Wextra"], TU, ".cu")


@test
def headers_are_template_free():
    banned = re.compile(r"\btemplate\s*<|\bclass\s+\w+\s*[:{]|\bstd::|\boperator\s*[^\w\s]|"
                        r"\bnamespace\b|\[\s*[&=]?\s*\]\s*\(")
    for path in glob.glob(os.path.join(ROOT, "*.h")) + glob.glob(os.path.join(ROOT, "*.cuh")):
        with open(path) as f:
            for number, line in enumerate(f, 1):
                code = line.split("//")[0]
                assert not banned.search(code), f"{os.path.basename(path)}:{number}: {line.strip()}"


@test
def version_is_the_same_everywhere():
    """flashattn.h's version macros, its first line, its revision history's
    newest entry and flashattn_cuda.cuh's first line name one version."""
    with open(os.path.join(ROOT, "flashattn.h")) as f:
        h = f.read()
    with open(os.path.join(ROOT, "flashattn_cuda.cuh")) as f:
        cuh_first = f.readline()
    macros = ".".join(re.search(rf"#define FA_VERSION_{n} (\d+)", h).group(1)
                      for n in ("MAJOR", "MINOR", "PATCH"))
    named = {"macros": macros,
             "flashattn.h line 1": re.search(r"v(\d+\.\d+\.\d+)", h.splitlines()[0]).group(1),
             "revision history": re.search(r"REVISION HISTORY\n\s+(\d+\.\d+\.\d+)", h).group(1),
             "flashattn_cuda.cuh line 1": re.search(r"v(\d+\.\d+\.\d+)", cuh_first).group(1)}
    assert len(set(named.values())) == 1, named
    return macros


def first_comment_command(path):
    with open(path) as f:
        first = f.readline()
    match = re.match(r"\s*(?:/\*|//)\s*Build:\s*(.*?)\s*(?:\*/)?\s*$", first)
    assert match, f"{path}: first line must be '/* Build: <command> */'"
    return match.group(1)


def build_example(path):
    command = first_comment_command(path)
    tool = command.split()[0]
    if not shutil.which(tool):
        raise Skip(f"{tool} not found")
    with tempfile.TemporaryDirectory() as tmp:
        # The command is written for the repository root; outputs go to tmp.
        command = re.sub(r"-o\s+(\S+)", lambda m: "-o " + os.path.join(tmp, os.path.basename(m.group(1))), command)
        out = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, command + "\n" + out.stderr
        assert "warning" not in out.stderr.lower(), out.stderr


for example in sorted(glob.glob(os.path.join(ROOT, "examples", "*.c")) +
                      glob.glob(os.path.join(ROOT, "examples", "*.cu"))):
    case("example_builds_" + os.path.basename(example), build_example, example)


def write_unit(path, defines, lines):
    """A .cu file of #defines (nvcc's -D splits a value at its commas, and
    tile rows have them) and lines."""
    with open(path, "w") as f:
        for d in defines:
            name, _, value = d.partition("=")
            f.write(f"#define {name} {value or 1}\n")
        f.write("\n".join(lines) + "\n")


def nvcc(args):
    out = subprocess.run(["nvcc"] + args, capture_output=True, text=True)
    assert out.returncode == 0, "nvcc " + " ".join(args) + "\n" + out.stderr[-4000:]
    return out.stderr


def ptxas_report(arch_flags, defines=()):
    """ptxas -v of the CUDA header built as one unit for arch_flags; defines
    are NAME=VALUE strings."""
    if not shutil.which("nvcc"):
        raise Skip("nvcc not found")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.cu")
        write_unit(src, defines, ["#define FLASHATTN_IMPLEMENTATION", "#define FLASHATTN_CUDA_IMPLEMENTATION",
                                  '#include "flashattn_cuda.cuh"'])
        return nvcc(["-c", "-O3", "-Xptxas", "-v", "-Xcompiler", "-Wall,-Wextra", "-I", ROOT, src,
                     "-o", os.path.join(tmp, "k.o")] + arch_flags)


def split_build(tmp, arch_flags, defines, dims, main=None):
    """The library split over units (FA_CUDA_SPLIT): the host unit and a
    kernel unit per head dim in dims, compiled in parallel with ptxas -v;
    with main, linked into tmp/main. Returns the units' ptxas reports."""
    if not shutil.which("nvcc"):
        raise Skip("nvcc not found")
    units = [("host", ["#define FLASHATTN_IMPLEMENTATION", "#define FLASHATTN_CUDA_IMPLEMENTATION"])]
    units += [(f"d{d}", ["#define FLASHATTN_CUDA_KERNELS", f"#define FA_CUDA_UNIT_HEAD_DIM {d}"]) for d in dims]
    jobs = []
    for name, lines in units:
        src = os.path.join(tmp, name + ".cu")
        write_unit(src, list(defines) + ["FA_CUDA_SPLIT=1"], lines + ['#include "flashattn_cuda.cuh"'])
        jobs.append(["-c", "-O3", "-Xptxas", "-v", "-Xcompiler", "-Wall,-Wextra", "-I", ROOT, src,
                     "-o", os.path.join(tmp, name + ".o")] + arch_flags)
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        reports = list(pool.map(nvcc, jobs))
    if main:
        src = os.path.join(tmp, "main.cu")
        write_unit(src, defines, [main])
        nvcc(["-O0", "-I", ROOT, src, "-o", os.path.join(tmp, "main")] + arch_flags +
             [os.path.join(tmp, name + ".o") for name, _ in units])
    return "".join(reports)


def spill_check(report):
    entry, spills = "", []  # each spill with the kernel it is in
    for line in report.splitlines():
        if "Compiling entry function" in line:
            entry = line.split("'")[1] if "'" in line else line
        elif re.search(r"[1-9]\d* bytes spill", line):
            spills.append(f"{entry}: {line.strip()}")
    stack = [l for l in report.splitlines() if re.search(r"[1-9]\d* bytes stack frame", l)]
    serial = [l for l in report.splitlines() if re.search(r"C75\d\d|serializ|warning", l)]
    kernels = report.count("Compiling entry function")
    assert kernels > 0, "no kernels compiled"
    assert not spills and not serial, "\n".join(spills + serial)
    return f"{kernels} kernels, no spills" + (f", {len(stack)} with stack frames" if stack else "")


def check_no_spills(arch_flags, *defines, dims=None):
    """No spills nor wgmma serialization in one unit, or (dims) in the split
    units of those head dims."""
    if dims is None:
        return spill_check(ptxas_report(arch_flags, defines))
    with tempfile.TemporaryDirectory() as tmp:
        return spill_check(split_build(tmp, arch_flags, defines, dims))


SM80 = ["-gencode=arch=compute_80,code=sm_80"]
SM90A = ["-gencode=arch=compute_90a,code=sm_90a"]
ALL_DIMS = (256, 192, 128, 160, 96, 64, 32)  # heaviest first, as `make cuda-lib`
FA3_DIMS = (256, 128, 64)
case("cuda_sm90a_ablations", check_no_spills, SM90A,
     "FA_CUDA_DTYPE=2", "FA_FA3_OVERLAP=0", "FA_FA3_PINGPONG=0", dims=FA3_DIMS)
case("cuda_sm90a_no_speculative_exps", check_no_spills, SM90A,
     "FA_HEAD_DIM=256", "FA_CUDA_DTYPE=2", "FA_FA3_SPECULATIVE=0", "FA_FA2_SPECULATIVE=0")
# Tile rows replaced: d = 64 on a 128 x 192 tile with no second variant, d =
# 128 on 192 x 64 with one Q buffer.
case("cuda_sm90a_custom_tiles", check_no_spills, SM90A,
     "FA_CUDA_DTYPE=1", "FA_FA3_FWD_TILE_64_0=128,192,2,2,1,0,0",
     "FA_FA3_FWD_TILE_64_1=0,0,0,0,0,0,0", "FA_FA3_FWD_TILE_128_0=192,64,2,1,1,2,0",
     "FA_FA3_FWD_TILE_128_1=0,0,0,0,0,0,0", dims=(128, 64))
case("cuda_one_config_custom_tile", check_no_spills, SM80,
     "FA_HEAD_DIM=64", "FA_CUDA_DTYPE=2", "FA_FA2_FWD_TILE_64=64,64,4,2,0")
case("cuda_fa1_variant", check_no_spills, SM80,
     "FA_HEAD_DIM=128", "FA_VARIANT=1")
case("cuda_fa2_single_stage", check_no_spills, SM80, "FA_HEAD_DIM=128", "FA_CUDA_DTYPE=2",
     "FA_FA2_FWD_TILE_128=128,64,4,1,0")


def is_a_compile_error(arch_flags, defines, message):
    try:
        ptxas_report(arch_flags, defines)
    except AssertionError as failure:
        assert message in str(failure), str(failure)[-500:]
        return
    raise AssertionError(f"{defines} compiled")


case("cuda_sm90_smem_over_budget_is_a_compile_error", is_a_compile_error, SM90A,
     ["FA_HEAD_DIM=256", "FA_FA3_FWD_TILE_256_0=128,128,2,1,1,2,1"], "FA3 tiles exceed shared memory")
case("cuda_sm90_registers_over_budget_is_a_compile_error", is_a_compile_error, SM90A,
     ["FA_HEAD_DIM=256", "FA_FA3_FWD_TILE_256_0=192,80,2,1,1,2,1"],
     "FA3 accumulators exceed the consumer registers")
case("cuda_bad_tile_is_a_compile_error", is_a_compile_error, SM80,
     ["FA_HEAD_DIM=64", "FA_FA2_FWD_TILE_64=96,64,4,2,0"], "ROWS must be 16 or 32 times WARPS")
case("cuda_bad_kv_stages_is_a_compile_error", is_a_compile_error, SM80,
     ["FA_HEAD_DIM=64", "FA_FA2_FWD_TILE_64=128,128,4,3,0"], "STAGES must be 1 or 2")


LOOKUP = r"""
#include "flashattn_cuda.cuh"
#include <stdio.h>
/* Prints, per head dim and dtype, fa_cuda_supported's status: it looks
   kernels up before it asks for a device, so "not in this build"
   (FA_ERR_UNSUPPORTED) shows without a GPU (else FA_OK or FA_ERR_CUDA). */
int main(void)
{
    static uint16_t q[256], k[256], v[256], o[256];
    static float descale[1] = {1.0f};
    const int dims[] = {32, 48, 59, 64, 96, 128, 160, 192, 256, 264};
    int i, t;
    for (i = 0; i < 10; ++i)
        for (t = FA_DTYPE_F16; t <= FA_DTYPE_FP8_E4M3; ++t) {
            fa_params p = {0};
            p.batch = p.heads_q = p.seqlen_q = p.seqlen_k = 1;
            p.head_dim = dims[i];
            p.dtype = (fa_dtype)t;
            p.q = q, p.k = k, p.v = v, p.o = o;
            if (t == FA_DTYPE_FP8_E4M3) { /* one descale per tensor */
                p.o_dtype = FA_DTYPE_BF16;
                p.fp8_scaling = FA_FP8_SCALE_TENSOR;
                p.q_descale = p.k_descale = p.v_descale = descale;
            }
            printf("%d %d %d\n", dims[i], t, (int)fa_cuda_supported(&p, FA_PASS_FORWARD));
        }
    return 0;
}
"""
LOOKUP_ONE_UNIT = "#define FLASHATTN_IMPLEMENTATION\n#define FLASHATTN_CUDA_IMPLEMENTATION\n" + LOOKUP


def lookup_statuses(exe):
    """{(head dim, dtype): found} from the lookup program."""
    run = subprocess.run([exe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    found = {}
    for d, t, status in map(str.split, run.stdout.split("\n")[:-1]):
        # A valid problem is either not in the build or found (FA_OK with a
        # GPU, FA_ERR_CUDA without one); any other status is a test bug.
        assert int(status) in (STATUS[n] for n in ("FA_OK", "FA_ERR_UNSUPPORTED", "FA_ERR_CUDA")), \
            f"d={d} dtype={t}: status {status}"
        found[(int(d), int(t))] = int(status) != STATUS["FA_ERR_UNSUPPORTED"]
    return found


FP8_DIMS = (64, 128, 256)
F16, BF16, E4M3 = 1, 2, 3  # fa_dtype


@test
def cuda_split_library():
    """The default library built as `make cuda-lib` does (a host unit and one
    kernel unit per head dim, sm_80 and sm_90a): no spills, and a program
    linked with it finds every 16-bit head dim up to 256 (those between the
    built ones on a larger one's tiles) and fp8 at its own, nothing else."""
    with tempfile.TemporaryDirectory() as tmp:
        detail = spill_check(split_build(tmp, SM80 + SM90A, [], ALL_DIMS, main=LOOKUP))
        for (d, t), f in lookup_statuses(os.path.join(tmp, "main")).items():
            want = d in FP8_DIMS if t == E4M3 else d <= max(ALL_DIMS) and d % 8 == 0
            assert f == want, f"split library: d={d} dtype={t} found={f}"
    return detail


@test
def cuda_kernel_lookup_follows_the_build():
    """A one-unit build of one head dim and dtype finds that dtype at that
    head dim and the smaller ones (multiples of 8) alone."""
    if not shutil.which("nvcc"):
        raise Skip("nvcc not found")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "lookup.cu"), os.path.join(tmp, "lookup")
        write_unit(src, ["FA_HEAD_DIM=128", "FA_CUDA_DTYPE=2"], [LOOKUP_ONE_UNIT])
        nvcc(["-O0", "-gencode=arch=compute_80,code=compute_80", "-I", ROOT, src, "-o", exe])
        for (d, t), f in lookup_statuses(exe).items():
            assert f == (d <= 128 and d % 8 == 0 and t == BF16), \
                f"d=128 bf16 build: d={d} dtype={t} found={f}"
