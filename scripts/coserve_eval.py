#!/usr/bin/env python3
"""Co-serving evaluation: the same traces replayed against `blink serve` in each way of
training (none, co-served with SLO admission, only when idle, a static split, co-served
without admission control), at several loads, for issue 22's acceptance figures.

For each trace shape and target load it first finds the rate at which the engine is busy
that share of the time serving alone (the inference-only utilisation), and the SLO targets
inference-only meets there; then it runs every (seed, mode) on a fresh server (an empty
prefix cache and state directory) with `blink replay --json`, and writes the results as
JSON lines and a markdown report. A standalone `blink finetune` run with the jobs'
settings gives S, the rate co-serving is measured against.

    scripts/coserve_eval.py --out /tmp/coserve -n 1000 --seeds 1,2,3

Only the Python standard library; the blink binary is `target/release/blink` unless
--blink says otherwise.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = {
    # name: (serve flags, trains?)
    "inference": ([], False),
    "coserve": (["--finetune-mode", "coserve", "--coserve-policy", "slo"], True),
    "idle": (["--finetune-mode", "coserve", "--coserve-policy", "idle"], True),
    "always": (["--finetune-mode", "coserve", "--coserve-policy", "always"], True),
    # The static split: the engine on one thread, the trainer on the other.
    "split": (["--finetune-mode", "split", "--finetune-threads", "1"], True),
    # A training thread beside a server that uses every core (they share the CPUs).
    "beside": (["--finetune-mode", "split", "--finetune-threads", "1"], True),
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def mode_flags(mode):
    """A mode's serve flags and whether it trains; `beside-F` is `beside` held to a share F
    of the time (a static slice of the machine)."""
    if mode.startswith("beside-"):
        return ["--finetune-mode", "split", "--finetune-threads", "1", "--finetune-share", mode.split("-", 1)[1]], True
    return MODES[mode]


class Server:
    """`blink serve` on a fresh state directory, stopped on exit."""

    def __init__(self, args, mode, slo, tag):
        self.dir = os.path.join(args.out, "state", tag)
        subprocess.run(["rm", "-rf", self.dir], check=True)
        os.makedirs(self.dir)
        flags, _ = mode_flags(mode)
        threads = ["-t", "1"] if mode == "split" else ["-t", str(args.threads)]
        cmd = [args.blink, "serve", "--port", "0", "--state-dir", self.dir, *threads,
               "--slo-ttft", str(slo[0]), "--slo-tpot", str(slo[1]), *flags]
        if args.latency:
            cmd += ["--latency", args.latency]
        if args.model:
            cmd += ["-m", args.model]
        self.log = open(os.path.join(args.out, "logs", f"serve-{tag}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise SystemExit(f"blink serve did not start: see {self.log.name}")

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def replay(args, url, shape, rate, seed, n, slo, finetune, tag):
    cmd = [args.blink, "replay", "--url", url, "--shape", shape, "-n", str(n), "--rate", f"{rate:.4f}",
           "--seed", str(seed), "--slo-ttft", str(slo[0]), "--slo-tpot", str(slo[1]),
           "--prompt-tokens", args.prompt_tokens, "--output-tokens", args.output_tokens,
           "--label", tag, "--json", "--svg", os.path.join(args.out, "svg", f"{tag}.svg")]
    if finetune:
        cmd += ["--finetune", args.data]
    with open(os.path.join(args.out, "logs", f"replay-{tag}.log"), "w") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    if out.returncode != 0:
        raise SystemExit(f"blink replay failed: see {err.name}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args, mode, shape, rate, seed, n, slo, tag):
    server = Server(args, mode, slo, tag)
    try:
        return replay(args, server.url, shape, rate, seed, n, slo, mode_flags(mode)[1], tag)
    finally:
        server.stop()


def find_rate(args, shape, target, slo):
    """The rate at which inference alone keeps the engine busy `target` of the time, and
    the last search run's summary."""
    rate = args.first_rate * target / 0.5
    for attempt in range(args.search_steps):
        s = run(args, "inference", shape, rate, 1000 + attempt, args.search_requests, slo, f"search-{shape}-{target}-{attempt}")
        busy = s["utilization"]["engine_busy"]
        log(f"  {shape} load {target}: {rate:.3f} req/s keeps the engine busy {busy:.3f}")
        if abs(busy - target) <= 0.03:
            break
        rate *= target / max(busy, 1e-3)
    return rate, s


def round_up(x, step):
    return step * -(-x // step)


def targets_from(search, floor):
    """Targets inference alone meets with room: twice its TTFT p99 and 1.5 times its TPOT
    p99 in the search run (other seeds differ), rounded up, and no tighter than `floor`."""
    ttft = max(floor[0], round_up(2.0 * search["ttft_s"]["p99"], 0.5))
    tpot = max(floor[1], round_up(1.5 * search["tpot_s"]["p99"], 0.05))
    return (round(ttft, 2), round(tpot, 3))


def standalone_rate(args):
    """S: `blink finetune` with the jobs' settings, tokens/s (median of 3), on one copy of
    the examples the jobs train on (the same tokens, a tenth of the time)."""
    rates = []
    for i in range(3):
        cmd = [args.blink, "finetune", "--data", os.path.join(ROOT, "testdata/finetune/zorbania-train.jsonl"), "--out", os.path.join(args.out, "standalone"),
               "--epochs", "1", "-t", str(args.threads), "--batch-size", "8", "--lr", "1e-3", "--warmup", "2",
               "--json"]
        if args.model:
            cmd += ["-m", args.model]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
        rates.append(json.loads(out.stdout.strip().splitlines()[-1])["trained_tokens_per_s"])
    return sorted(rates)[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--blink", default=os.path.join(ROOT, "target/release/blink"))
    p.add_argument("--model")
    p.add_argument("--latency", help="coefficients from `blink calibrate` (made here when absent)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-n", "--requests", type=int, default=1000)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--shapes", default="burst-light,burst-dense")
    p.add_argument("--loads", default="0.2,0.5,0.8")
    p.add_argument("--modes", default="inference,coserve")
    p.add_argument("--baseline-requests", type=int, default=300, help="requests of a baseline's run")
    p.add_argument("--baseline-modes", default="idle,split,beside,beside-0.5,beside-0.25,beside-0.1,always", help="run for the first seed only")
    p.add_argument("--slo", default="1,0.1", help="TTFT,TPOT targets in seconds (per load: 0.2=2,0.2;0.5=...); with --adapt-slo, the tightest allowed")
    p.add_argument("--adapt-slo", action="store_true", help="targets from the inference-only search run (see targets_from)")
    p.add_argument("--prompt-tokens", default="32:256")
    p.add_argument("--output-tokens", default="16:64")
    p.add_argument("--data", default=None, help="fine-tuning data (default: Zorbania ×10)")
    p.add_argument("--first-rate", type=float, default=3.0, help="a guess at the rate of 50%% load")
    p.add_argument("--search-requests", type=int, default=150)
    p.add_argument("--search-steps", type=int, default=3)
    args = p.parse_args()
    for d in ["logs", "svg", "state", "standalone"]:
        os.makedirs(os.path.join(args.out, d), exist_ok=True)
    if args.data is None:
        args.data = os.path.join(args.out, "train.jsonl")
        with open(os.path.join(ROOT, "testdata/finetune/zorbania-train.jsonl")) as f:
            lines = f.read()
        with open(args.data, "w") as f:
            f.write(lines * 10)
    if args.latency is None:
        args.latency = os.path.join(args.out, "latency.json")
        log("calibrating the latency model")
        subprocess.run([args.blink, "calibrate", "-t", str(args.threads), "-o", args.latency] + (["-m", args.model] if args.model else []), check=True, stdout=subprocess.DEVNULL)
    slos = {}
    for part in args.slo.split(";"):
        if "=" in part:
            load, v = part.split("=")
            slos[float(load)] = tuple(float(x) for x in v.split(","))
        else:
            slos[None] = tuple(float(x) for x in part.split(","))
    results = os.path.join(args.out, "results.jsonl")
    # A run interrupted and started again on the same --out goes on where it stopped: the
    # rows already written are kept, with their rates and targets.
    done = [json.loads(l) for l in open(results)] if os.path.exists(results) else []
    s_rate = next((r["standalone_tok_s"] for r in done if "standalone_tok_s" in r), None)
    if s_rate is None:
        log("standalone fine-tuning rate")
        s_rate = standalone_rate(args)
        with open(results, "a") as f:
            f.write(json.dumps({"standalone_tok_s": s_rate}) + "\n")
    log(f"  S = {s_rate:.1f} tok/s")
    seeds = [int(x) for x in args.seeds.split(",")]
    for shape in args.shapes.split(","):
        for load in [float(x) for x in args.loads.split(",")]:
            floor = slos.get(load, slos.get(None))
            earlier = [r for r in done if r.get("shape") == shape and r.get("load") == load]
            if earlier:
                rate, slo = earlier[0]["rate"], tuple(earlier[0]["slo"])
            else:
                rate, search = find_rate(args, shape, load, floor)
                slo = targets_from(search, floor) if args.adapt_slo else floor
            log(f"  {shape} load {load}: {rate:.3f} req/s, targets TTFT {slo[0]} s, TPOT {slo[1]} s")
            for seed in seeds:
                main_modes = args.modes.split(",")
                modes = main_modes + (args.baseline_modes.split(",") if seed == seeds[0] and args.baseline_modes else [])
                for mode in modes:
                    if any(r.get("shape") == shape and r.get("load") == load and r.get("seed") == seed and r.get("mode") == mode for r in done):
                        continue
                    tag = f"{shape}-{load}-{seed}-{mode}"
                    t0 = time.time()
                    n = args.requests if mode in main_modes else args.baseline_requests
                    s = run(args, mode, shape, rate, seed, n, slo, tag)
                    row = {"shape": shape, "load": load, "seed": seed, "mode": mode, "rate": rate, "slo": slo, "summary": s}
                    with open(results, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    log(f"{tag}: attainment {s['slo']['attainment_pct']:.2f}%, busy {s['utilization']['engine_busy']:.3f}, "
                        f"fine-tuning {s.get('finetune_tok_s') or 0:.1f} tok/s ({time.time() - t0:.0f} s)")
    log(f"results in {results}; the report: scripts/coserve_report.py {results}")


if __name__ == "__main__":
    main()
