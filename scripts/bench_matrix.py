#!/usr/bin/env python3
"""The real-scale speed matrix (issue 49): Blink against llama.cpp on random-weight GGUF
files of real model shapes, in the tensor-type mixes of llama.cpp's presets.

Owns: making the files it needs (with crates/blink-model/examples/synth_model.rs, cached in
a directory and reused), running `blink bench` and llama.cpp's `llama-bench` side by side
in alternating rounds (and `blink bench --batch 16` against `llama-batched-bench` for
16-sequence decoding), and the markdown table that goes into docs/PERFORMANCE.md: medians,
ratios, each decode cell's share of the memory-bandwidth bound, geometric means per thread
count, the CPU, the kernel path and the bandwidth. Standard library only.

    scripts/bench_matrix.py                                  # llama-1b, every preset, 1 and 2 threads, 3 rounds
    scripts/bench_matrix.py --shapes llama-8b --presets Q4_K_M,Q4_0
    scripts/bench_matrix.py --kernel avx2 --llama-bin /opt/llama.cpp/build-avx2/bin   # AVX-512 machine, AVX2 paths
    scripts/bench_matrix.py --json runs.json                 # also every raw run
    scripts/bench_matrix.py --smoke                          # one layer of each shape, Blink only, one short round

Files are `<cache>/<shape>.<preset>.gguf` (a slice: `<shape>[.L<layers>][.V<vocab>][.U<rows>][.S<seed>].<preset>.gguf`),
default cache ~/.cache/blink/matrix/. `--dry-run` prints, as JSON lines, each file and the
generator arguments that make it, and runs nothing.
"""

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = ["llama-1b", "qwen2-1.5b", "gemma3-1b", "llama-8b"]
PRESETS = ["Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS"]
# --smoke: what it runs unless told otherwise.
SMOKE = dict(shapes=SHAPES, presets=["Q4_0", "Q4_K_M"], layers=1, vocab=1024, unique_rows=64, rounds=1, reps=1, p=16, n=4, npp=16)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", help=f"comma-separated, of {', '.join(SHAPES)} (default llama-1b)")
    p.add_argument("--presets", help=f"comma-separated, of {', '.join(PRESETS)}, F16 (default all but F16)")
    p.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    p.add_argument("--rounds", type=int, help="alternating rounds (default 3)")
    p.add_argument("--reps", type=int, help="repetitions per round, each tool's -r (default 1)")
    p.add_argument("-p", type=int, help="prompt length (default 512)")
    p.add_argument("-n", type=int, help="generation length (default 128)")
    p.add_argument("--batch", type=int, default=16, help="sequences for the batched-decode row (default 16; 0: none)")
    p.add_argument("--npp", type=int, help="tokens in each sequence's cache before batched decoding (llama-batched-bench -npp; default 128)")
    p.add_argument("--kernel", help="Blink's --kernel (e.g. avx2, to set against an AVX2-only llama.cpp)")
    p.add_argument("--blink-args", default="", help="more arguments for every blink bench (e.g. '--dot-order block')")
    p.add_argument("--llama-args", default="", help="more arguments for every llama-bench and llama-batched-bench")
    p.add_argument("--llama-bin", default="/opt/llama.cpp/build-avx2/bin", help="llama.cpp's build dir with llama-bench and llama-batched-bench")
    p.add_argument("--no-llama", action="store_true", help="Blink only")
    p.add_argument("--blink", default=str(REPO / "target/release/blink"), help="the blink binary")
    p.add_argument("--synth", help="the synth_model binary (default target/release/examples/synth_model, built when missing)")
    p.add_argument("--vocab-from", help="the GGUF file whose vocabulary the files take (default: the default model)")
    p.add_argument("--layers", type=int, help="only the first N layers of each shape")
    p.add_argument("--vocab", type=int, help="only the vocabulary's first N tokens (quick checks; not a real shape)")
    p.add_argument("--unique-rows", type=int, help="each matrix's rows drawn from N random rows quantized once (quick to make; same shapes and bytes)")
    p.add_argument("--seed", type=int, default=1, help="the weights' seed (default 1)")
    p.add_argument("--cache", default=str(Path.home() / ".cache/blink/matrix"), help="where the files are kept (default ~/.cache/blink/matrix)")
    p.add_argument("--json", metavar="FILE", help="write every raw run, the machine and the summary as JSON")
    p.add_argument("--smoke", action="store_true", help="a one-layer slice of each shape (1024-token vocabulary, 64 distinct rows per matrix), Q4_0 and Q4_K_M, Blink only, one round of -p 16 -n 4 -r 1")
    p.add_argument("--dry-run", action="store_true", help="print each file and its generator arguments as JSON lines; run nothing")
    a = p.parse_args(argv)
    smoke = SMOKE if a.smoke else {}
    a.shapes = a.shapes.split(",") if a.shapes else smoke.get("shapes", ["llama-1b"])
    a.presets = a.presets.split(",") if a.presets else smoke.get("presets", PRESETS)
    for name, value, known in [("shape", a.shapes, SHAPES), ("preset", a.presets, PRESETS + ["F16"])]:
        bad = [v for v in value if v not in known]
        if bad:
            p.error(f"unknown {name} {', '.join(bad)} (known: {', '.join(known)})")
    for key, default in [("rounds", 3), ("reps", 1), ("p", 512), ("n", 128), ("npp", 128), ("layers", None), ("vocab", None), ("unique_rows", None)]:
        if getattr(a, key) is None:
            setattr(a, key, smoke.get(key, default))
    try:
        a.threads = [int(t) for t in a.threads.split(",")]
    except ValueError:
        p.error(f"--threads takes whole numbers separated by commas, not {a.threads!r}")
    if a.smoke:
        a.no_llama = True
    if a.rounds < 1 or a.reps < 1 or min(a.threads) < 1:
        p.error("--rounds, --reps and --threads must be at least 1")
    return a


class Matrix:
    """One file of the matrix: a shape in a preset."""

    def __init__(self, a, shape, preset):
        self.shape, self.preset = shape, preset
        # What sets the file apart from the full shape, in its name.
        slice_ = "".join(f".{tag}{v}" for tag, v in [("L", a.layers), ("V", a.vocab), ("U", a.unique_rows), ("S", a.seed if a.seed != 1 else None)] if v)
        self.path = Path(a.cache) / f"{shape}{slice_}.{preset}.gguf"
        self.label = f"{shape} {preset}" + (f", {a.layers} layer{'s' if a.layers != 1 else ''}" if a.layers else "")
        self.synth_args = ["--shape", shape, "--preset", preset, "--seed", str(a.seed), "-o", str(self.path)]
        if a.layers:
            self.synth_args += ["--layers", str(a.layers)]
        if a.vocab:
            self.synth_args += ["--vocab", str(a.vocab)]
        if a.unique_rows:
            self.synth_args += ["--unique-rows", str(a.unique_rows)]
        if a.vocab_from:
            self.synth_args += ["--vocab-from", a.vocab_from]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, timeout=7200):
    """Runs `cmd`; (stdout, stderr, seconds). Fails loudly with its stderr's end."""
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{shlex.join(map(str, cmd))} failed ({r.returncode}):\n{tail}")
    return r.stdout, r.stderr, took


def synth_binary(a):
    if a.synth:
        return a.synth
    path = REPO / "target/release/examples/synth_model"
    if not path.exists():
        log("bench_matrix: building the generator (cargo build --release -p blink-model --example synth_model)")
        subprocess.run(["cargo", "build", "--release", "-p", "blink-model", "--example", "synth_model"], cwd=REPO, check=True)
    return str(path)


def ensure_files(a, files):
    missing = [f for f in files if not f.path.exists()]
    if not missing:
        return
    synth = synth_binary(a)
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    for f in missing:
        log(f"bench_matrix: making {f.path}")
        _, err, took = run([synth, *f.synth_args])
        log(f"  {err.strip().splitlines()[-1] if err.strip() else ''} ({took:.0f} s)")


def blink_rows(stdout):
    """The JSON array `blink bench --json` prints."""
    start = stdout.find("[")
    if start < 0:
        raise RuntimeError(f"no JSON in blink bench's output: {stdout[:200]!r}")
    return json.loads(stdout[start:])


def llama_bench_rows(stdout):
    start = stdout.find("[")
    if start < 0:
        raise RuntimeError(f"no JSON in llama-bench's output: {stdout[:200]!r}")
    return json.loads(stdout[start:])


class Runner:
    """Runs the tools and keeps every run."""

    def __init__(self, a):
        self.a = a
        self.runs = []
        self.blink_info = {}
        self.llama_info = {}
        self.bandwidth = {}  # threads -> [GB/s]
        self.bytes_per_token = {}  # file label -> bytes
        self.llama_bin = Path(a.llama_bin)
        self.blink_extra = (["--kernel", a.kernel] if a.kernel else []) + shlex.split(a.blink_args)
        self.llama_extra = shlex.split(a.llama_args)

    def record(self, f, tool, test, threads, rnd, samples, cmd, took):
        self.runs.append(dict(file=f.label, path=str(f.path), shape=f.shape, preset=f.preset, tool=tool, test=test,
                              threads=threads, round=rnd, samples=samples, cmd=shlex.join(map(str, cmd)), seconds=round(took, 2)))

    def bound(self, f):
        """Weight bytes a decode step reads, and this machine's bandwidth, from Blink."""
        cmd = [self.a.blink, "bench", "-m", f.path, "-p", "0", "-n", "0", "-t", ",".join(map(str, self.a.threads)), "--bandwidth", *self.blink_extra]
        out, _, _ = run(cmd)
        for m in re.finditer(r"bandwidth: (\d+) thread\(s\) ([\d.]+) GB/s \(triad\); decode reads ([\d.]+) MB/token", out):
            self.bandwidth.setdefault(int(m.group(1)), []).append(float(m.group(2)))
            self.bytes_per_token[f.label] = float(m.group(3)) * 1e6

    def blink(self, f, threads, rnd):
        a = self.a
        cmd = [a.blink, "bench", "-m", f.path, "-p", str(a.p), "-n", str(a.n), "-t", str(threads), "-r", str(a.reps), "--json", *self.blink_extra]
        out, _, took = run(cmd)
        for row in blink_rows(out):
            self.blink_info = dict(kernel=row["kernel"], dot_order=row["dot_order"], file_type=row["file_type"])
            if row["batch"] == 1 and row["loras"] == 0:
                self.record(f, "blink", row["test"], threads, rnd, row["samples"], cmd, took)

    def llama(self, f, threads, rnd):
        a = self.a
        cmd = [self.llama_bin / "llama-bench", "-m", f.path, "-p", str(a.p), "-n", str(a.n), "-t", str(threads), "-r", str(a.reps), "-o", "json", *self.llama_extra]
        out, _, took = run(cmd)
        for row in llama_bench_rows(out):
            self.llama_info = dict(build_commit=row.get("build_commit"), cpu_info=row.get("cpu_info"), backends=row.get("backends"))
            test = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
            self.record(f, "llama.cpp", test, threads, rnd, row["samples_ts"], cmd, took)

    def blink_batch(self, f, threads, rnd):
        a = self.a
        cmd = [a.blink, "bench", "-m", f.path, "-p", "0", "-n", str(a.n), "--batch", str(a.batch), "-d", str(a.npp), "-t", str(threads), "-r", str(a.reps), "--json", *self.blink_extra]
        out, _, took = run(cmd)
        for row in blink_rows(out):
            if row["batch"] == a.batch:
                self.record(f, "blink", f"tg{a.n}x{a.batch}", threads, rnd, row["samples"], cmd, took)

    def llama_batch(self, f, threads, rnd):
        a = self.a
        ctx = a.batch * (a.npp + a.n)
        cmd = [self.llama_bin / "llama-batched-bench", "-m", f.path, "-c", str(ctx), "-npp", str(a.npp), "-ntg", str(a.n), "-npl", str(a.batch), "-t", str(threads), "--output-format", "jsonl", *self.llama_extra]
        samples = []
        took = 0.0
        for _ in range(a.reps):
            out, _, t = run(cmd)
            took += t
            rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            samples += [r["speed_tg"] for r in rows if r.get("pl") == a.batch]
        self.record(f, "llama.cpp", f"tg{a.n}x{a.batch}", threads, rnd, samples, cmd, took)

    def matrix(self, files):
        a = self.a
        for f in files:
            self.bound(f)
        cells = [(f, t) for f in files for t in a.threads]
        for rnd in range(a.rounds):
            for i, (f, t) in enumerate(cells):
                log(f"bench_matrix: round {rnd + 1}/{a.rounds}: {f.label}, {t} thread(s)")
                tools = [self.blink] + ([] if a.no_llama else [self.llama])
                batch = ([self.blink_batch] + ([] if a.no_llama else [self.llama_batch])) if a.batch else []
                # Alternate which tool goes first, so a drifting machine touches both alike.
                if (rnd + i) % 2:
                    tools.reverse()
                    batch.reverse()
                for step in tools + batch:
                    step(f, t, rnd)


def machine():
    name, cpus, flags = "unknown CPU", 0, set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                name = value.strip()
                cpus += 1
            elif key == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "asimd", "asimddp"] if f in flags]
    return dict(cpu=name, cpus=cpus, isa=isa)


def median(xs):
    return statistics.median(xs) if xs else None


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def ratio(b, l):
    return b / l if b and l else None


def times(x, bold=False):
    """A ratio cell: `1.23×`, or a dash."""
    if x is None:
        return "—"
    return f"**{x:.2f}×**" if bold else f"{x:.2f}×"


def summarize(r, files):
    """Per file and thread count: the medians of every sample, both tools, and the ratios."""
    a = r.a
    rows = []
    for f in files:
        for t in a.threads:
            def med(tool, test):
                return median([s for run in r.runs if run["file"] == f.label and run["threads"] == t and run["tool"] == tool and run["test"] == test for s in run["samples"]])
            pp, tg, bt = f"pp{a.p}", f"tg{a.n}", f"tg{a.n}x{a.batch}"
            row = dict(file=f.label, threads=t, bytes_per_token=r.bytes_per_token.get(f.label))
            for test, key in [(pp, "pp"), (tg, "tg"), (bt, "batch")]:
                row[key] = dict(blink=med("blink", test), llama=med("llama.cpp", test))
                row[key]["ratio"] = ratio(row[key]["blink"], row[key]["llama"])
            gbs = median(r.bandwidth.get(t, []))
            if gbs and row["bytes_per_token"]:
                row["tg"]["share"] = {tool: (v * row["bytes_per_token"] / (gbs * 1e9) if v else None) for tool, v in [("blink", row["tg"]["blink"]), ("llama", row["tg"]["llama"])]}
            rows.append(row)
    return rows


def table(r, rows, mach):
    a = r.a
    out = []
    bw = ", ".join(f"{t} thread{'s' if t > 1 else ''} {median(v):.1f} GB/s" for t, v in sorted(r.bandwidth.items()))
    info = r.blink_info
    out.append(f"CPU: {mach['cpu']} ({mach['cpus']} CPUs; {' '.join(mach['isa']) or 'no SIMD flags read'}). "
               f"Blink: kernel path {info.get('kernel', '?')}, {info.get('dot_order', '?')} dot order"
               + (f" (`--kernel {a.kernel}`)" if a.kernel else "") + (f", `{a.blink_args}`" if a.blink_args else "") + ". "
               + ("llama.cpp: not run." if a.no_llama else
                  f"llama.cpp: {r.llama_info.get('build_commit', '?')} from `{a.llama_bin}` ({r.llama_info.get('backends', '?')})"
                  + (f", `{a.llama_args}`" if a.llama_args else "") + "."))
    out.append("")
    out.append(f"Memory bandwidth (`blink bench --bandwidth`, STREAM triad): {bw or 'not measured'}. The bound for decode is that "
               f"bandwidth ÷ the weight bytes a token reads; a cell's share is tok/s × bytes per token ÷ bandwidth.")
    out.append("")
    out.append(f"{a.rounds} alternating round{'s' if a.rounds > 1 else ''} of `-r {a.reps}`; medians of every sample, tok/s "
               f"(Blink `blink bench -p {a.p} -n {a.n}`, llama.cpp `llama-bench -p {a.p} -n {a.n}`).")
    out.append("")
    pp, tg = f"pp{a.p}", f"tg{a.n}"
    out.append(f"| file | threads | {pp} Blink | {pp} llama.cpp | {pp} ratio | {tg} Blink | {tg} llama.cpp | {tg} ratio | {tg} share of bound (Blink / llama.cpp) |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        mb = row["bytes_per_token"]
        share = row["tg"].get("share", {})
        pct = lambda x: "—" if x is None else f"{100 * x:.0f}%"
        name = row["file"] + (f" ({mb / 1e6:.0f} MB/token)" if mb else "")
        out.append(f"| {name} | {row['threads']} | {fmt(row['pp']['blink'])} | {fmt(row['pp']['llama'])} | {times(row['pp']['ratio'])} | "
                   f"{fmt(row['tg']['blink'])} | {fmt(row['tg']['llama'])} | {times(row['tg']['ratio'])} | {pct(share.get('blink'))} / {pct(share.get('llama'))} |")
    for t in a.threads:
        sel = [row for row in rows if row["threads"] == t]
        gp, gt = geomean([row["pp"]["ratio"] for row in sel]), geomean([row["tg"]["ratio"] for row in sel])
        out.append(f"| **geometric mean** | {t} | | | {times(gp, True)} | | | {times(gt, True)} | |")
    if a.batch:
        out.append("")
        out.append(f"{a.batch} sequences decoding, tok/s summed over the sequences (`blink bench --batch {a.batch} -d {a.npp} -n {a.n}` / "
                   f"`llama-batched-bench -npp {a.npp} -ntg {a.n} -npl {a.batch}`, S_TG):")
        out.append("")
        out.append("| file | threads | Blink | llama.cpp | ratio |")
        out.append("| --- | ---: | ---: | ---: | ---: |")
        for row in rows:
            b = row["batch"]
            out.append(f"| {row['file']} | {row['threads']} | {fmt(b['blink'])} | {fmt(b['llama'])} | {times(b['ratio'])} |")
        for t in a.threads:
            g = geomean([row["batch"]["ratio"] for row in rows if row["threads"] == t])
            out.append(f"| **geometric mean** | {t} | | | {times(g, True)} |")
    return "\n".join(out)


def main(argv):
    a = parse_args(argv)
    files = [Matrix(a, s, p) for s in a.shapes for p in a.presets]
    if a.dry_run:
        for f in files:
            print(json.dumps(dict(file=str(f.path), exists=f.path.exists(), synth_args=f.synth_args)))
        return 0
    if not Path(a.blink).exists():
        sys.exit(f"bench_matrix: no blink binary at {a.blink}: build it (cargo build --release -p blink) or name it with --blink")
    if not a.no_llama:
        for tool in ["llama-bench"] + (["llama-batched-bench"] if a.batch else []):
            if not (Path(a.llama_bin) / tool).exists():
                sys.exit(f"bench_matrix: no {tool} in {a.llama_bin}: name llama.cpp's build dir with --llama-bin, or run Blink alone with --no-llama")
    ensure_files(a, files)
    r = Runner(a)
    start = time.monotonic()
    r.matrix(files)
    rows = summarize(r, files)
    mach = machine()
    print(table(r, rows, mach))
    log(f"bench_matrix: {len(r.runs)} runs in {time.monotonic() - start:.0f} s")
    if a.json:
        config = {k: v for k, v in vars(a).items()}
        Path(a.json).write_text(json.dumps(dict(machine=mach, config=config, blink=r.blink_info, llama=r.llama_info,
                                                bandwidth_gbs=r.bandwidth, bytes_per_token=r.bytes_per_token,
                                                summary=rows, runs=r.runs), indent=1, default=str))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        sys.exit(f"bench_matrix: {e}")
