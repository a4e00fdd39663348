"""Every GPU bench and the CUDA tests in one run, within one 600 s device command, and one table.

Run (CUDA):  python benches/gpu_all.py           (or benches/gpu_all.sh)
Dry run:     python benches/gpu_all.py --tiny    (the same parts on CPU, tiny shapes; about a minute)

Each part runs as a subprocess of its own (one failure or timeout does not stop the
rest), with a time budget, and a part may also use what the parts before it left unused,
so the whole run stays within the total (``--total``, 580 s: a 600 s device command less
20 s for starting and the table). The budgets add up to 680 s (the verl part's two
launches, Ray, vLLM and FSDP started twice, need about 210 s), more than the total: on a
GPU each part's budget is scaled by total / 680 (0.85 by default), and the verl part, the
last, gets all that is left. ``--total 680`` (a longer device command) gives every part its
whole budget; ``--only`` runs some parts (``--only gpu_verl_step`` alone in its own
command). Each part gets its time limit in ``GPU_ALL_PART_TIMEOUT`` (seconds), so a part
that launches jobs can share it out. The parts, in order:

    tests/gpu          python -m pytest tests/gpu (--tiny: COMPPO_GPU_TESTS_DEVICE=cpu, the
                       tests' own dry run with the "device" tensors on the CPU)
    gpu_gae            the verl drop-in on device tensors against verl's loop (>= 20x at W1)
    gpu_probe          the attention probe's forward (<= 1.3x time, <= 1.05x memory)
    gpu_critic         the scoring forward with TAC (<= 1.25x time, <= 1.05x memory)
    gpu_train_step     the seven arms' PPO step (comppo <= 1.15x grpo, <= 0.7x ppo, ...)
    gpu_trl_step       CompPOTrainer (comppo) against GRPOTrainer on a Qwen3-0.6B shape in
                       bfloat16 with random weights (nothing downloaded), vLLM colocate when
                       vllm imports (step <= 1.15x, peak memory <= 1.05x)
    gpu_trl_step zero3 the same, each trainer a 1-process DeepSpeed ZeRO-3 job
                       (accelerate launch; the bench checks that ZeRO-3 really ran)
    gpu_verl_step      the verl recipe (python -m comppo_core.integrations.verl.main_ppo,
                       comppo arm) against verl's own GAE + critic PPO, 2 steps each at the
                       same batch on a Qwen3-0.6B shape, vLLM rollouts, FSDP2: step time and
                       train time (no generation) of each and their ratio (no target: shown,
                       not judged). Needs verl[verl-core] and vllm; without them (or verl
                       in the dry run) the row says "skipped: <what is missing>"

With ``--tiny`` every part runs its CPU dry run (tiny shapes, a round or two, one torch
thread, parts two at a time): the scripts' code paths end to end, without CUDA. What
needs CUDA is marked ``skipped: no CUDA`` with the reason (the peak-memory targets,
vLLM), never passed; the dry run's figures are printed but not judged (``n/a``).
ZeRO-3 runs in the dry run when ``deepspeed`` imports (over gloo on CPU). The verl part's
dry run builds the files, composes and validates both jobs' configs with verl's own checks
and prints the command lines; the launch is ``skipped: no CUDA``.

Each part's whole output goes to a log file (the directory is printed; ``--logs DIR``);
the table follows, then the last lines of each failed part's log. ``--json PATH`` writes
the rows. Exit status 0 when every part ran (and, on a GPU, met its targets), 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ROOT / "benches"
NO_CUDA = "skipped: no CUDA"


@dataclass
class Figure:
    """One measured figure and its target (``bound`` with ``sense``; none: shown, not judged)."""

    name: str
    value: float | None
    bound: float | None = None
    sense: str = "<="
    unit: str = "x"
    note: str = ""  # why there is no value

    def shown(self) -> str:
        if self.value is None:
            return f"{self.name}: {self.note}"
        return f"{self.name} {self.value:.3g}{self.unit}"

    def target(self) -> str:
        return "" if self.bound is None else f"{self.name} {self.sense} {self.bound:g}{self.unit}"

    def met(self) -> bool | None:
        if self.bound is None or self.value is None:
            return None
        return self.value <= self.bound if self.sense == "<=" else self.value >= self.bound


@dataclass
class Part:
    name: str
    gpu: list[str]  # the command after the interpreter, on a GPU
    tiny: list[str] | None  # the dry run's; None: the part needs CUDA
    budget: float  # seconds on a GPU
    tiny_budget: float
    parse: Callable[[str, bool], tuple[list[Figure], list[str]]]  # (output, tiny) -> figures, problems
    miss_codes: tuple[int, ...] = ()  # exit codes that mean "ran, a target missed" (figures parsed)
    skip_codes: tuple[int, ...] = ()  # exit codes that mean "cannot run here" (its "skipped: ..." line says why)
    needs: Callable[[bool], str] = lambda tiny: ""  # a reason it cannot run here (tiny: in the dry run), or ""
    env: dict[str, str] = field(default_factory=dict)
    tiny_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Row:
    part: str
    status: str = ""
    seconds: float = 0.0
    rc: int | None = None
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log: str = ""
    ran: bool = False  # the command ran to its end and its figures were found
    failed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "status": self.status,
            "ran": self.ran,
            "failed": self.failed,
            "seconds": round(self.seconds, 1),
            "rc": self.rc,
            "figures": [
                {
                    "name": f.name,
                    "value": f.value,
                    "bound": f.bound,
                    "sense": f.sense,
                    "unit": f.unit,
                    "note": f.note,
                    "met": f.met(),
                }
                for f in self.figures
            ],
            "notes": self.notes,
            "log": self.log,
        }


# --------------------------------------------------------------------------- #
# reading each part's output
# --------------------------------------------------------------------------- #

NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse_pytest(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
    summary = [
        line for line in out.splitlines() if re.search(r"\b(passed|failed|skipped|errors?)\b.* in [0-9.]+s", line)
    ]
    if not summary:
        return [], ["no pytest summary line"]
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary[-1]):
        counts["error" if what.startswith("error") else what] += int(n)
    figures = [
        Figure("passed", float(counts["passed"]), unit=""),
        Figure("failed + errors", float(counts["failed"] + counts["error"]), 0.0, "<=", unit=""),
        Figure("skipped", float(counts["skipped"]), unit=""),
    ]
    problems = [] if counts["passed"] else ["no test passed"]
    return figures, problems


def parse_gae(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    m = re.search(rf"target ≥ {NUMBER}× at .*?: (?:met|NOT met) \(lowest {NUMBER}×\)", out)
    if not m:
        return [], ["no 'target ≥ ...× at W1' line"]
    disagree = len(re.findall(r"\s+NO\s*$", out, re.M))
    figures = [
        Figure("W1 speedup (lowest)", float(m.group(2)), float(m.group(1)), ">="),
        Figure("cases disagreeing with verl", float(disagree), 0.0, "<=", unit=""),
    ]
    return figures, []


def parse_probe(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    row = re.search(
        rf"^\s*entropy\s+\S+\s+\S+\s+{NUMBER}x\s+\|.*?\|\s+\S+ MiB\s+\S+\s+{NUMBER}x\s+targets ≤ {NUMBER}x time, "
        rf"≤ {NUMBER}x memory",
        out,
        re.M,
    )
    checks = re.findall(r"^check .*\((?:tolerance \S+: )?(ok|FAILED)\)", out, re.M)
    if not row:
        return [], ["no 'entropy' row with its targets"]
    figures = [
        Figure("time", float(row.group(1)), float(row.group(3))),
        Figure("memory (no logits)", float(row.group(2)), float(row.group(4))),
        Figure("self-checks failed", float(checks.count("FAILED")), 0.0, "<=", unit=""),
    ]
    return figures, [] if checks else ["no self-check lines"]


def parse_critic(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    m = re.search(
        rf"targets: rl\.forward\+TAC time {NUMBER} \(<= {NUMBER}\), peak memory {NUMBER} \(<= {NUMBER}\)", out
    )
    if not m:
        return [], ["no 'targets: rl.forward+TAC' line"]
    v = [float(x) for x in m.groups()]
    return [Figure("TAC forward time", v[0], v[1]), Figure("peak memory", v[2], v[3])], []


def parse_train_step(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    blocks = re.split(r"\ntargets on the ", out)
    if len(blocks) < 3:
        return [], ["no 'targets on the ...' blocks"]
    figures = []
    for line in blocks[1].splitlines()[1:]:  # the train step's targets (the exit status follows these)
        m = re.match(rf"\s+(.+?): {NUMBER}( %)? \(<= {NUMBER}( %)?\): (?:met|NOT met)", line)
        if m:
            pct = bool(m.group(3))
            figures.append(Figure(m.group(1), float(m.group(2)), float(m.group(4)), unit="%" if pct else "x"))
    step = re.search(rf"\n\s+comppo / grpo time: {NUMBER} \(<= {NUMBER}\)", "\n" + blocks[2])
    if step:  # the full step, rollout included: shown, not judged
        figures.append(Figure("comppo / grpo step with rollout", float(step.group(1))))
    return figures, [] if figures else ["no target lines"]


def parse_trl(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    step = re.search(rf"^\s+step time: {NUMBER} \(<= {NUMBER}\)", out, re.M)
    train = re.search(rf"train step without generation: {NUMBER}", out)
    if not step or not train:
        return [], ["no 'step time' target line"]
    figures = [
        Figure("step", float(step.group(1)), float(step.group(2))),
        Figure("train step", float(train.group(1))),
    ]
    memory = re.search(rf"^\s+peak memory: {NUMBER} \(<= {NUMBER}\)", out, re.M)
    if memory:
        figures.append(Figure("peak memory", float(memory.group(1)), float(memory.group(2))))
    else:
        bound = re.search(rf"^\s+peak memory: not measured on CPU \(<= {NUMBER}\)", out, re.M)
        if not bound:
            return figures, ["no 'peak memory' target line"]
        figures.append(Figure("peak memory", None, float(bound.group(1)), note=f"{NO_CUDA} (torch.cuda peak memory)"))
    return figures, []


def parse_trl_zero3(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    figures, problems = parse_trl(out, tiny)
    if "backend check: ZeRO-3 ran" not in out:
        problems.append("no 'backend check: ZeRO-3 ran' line")
    return figures, problems


def parse_verl(out: str, tiny: bool) -> tuple[list[Figure], list[str]]:
    """benches/gpu_verl_step.py: the ratios and each job's step 2 (seconds); the dry run: the configs it
    composed and validated, the launch marked ``skipped: no CUDA``."""
    if tiny:
        dry = re.search(r"^dry run: (\d+) configs composed and validated", out, re.M)
        launch = re.search(r"^launch: (skipped: no CUDA.*)$", out, re.M)
        if not dry or not launch:
            return [], ["no 'dry run: ... configs composed and validated' and 'launch: skipped' lines"]
        figures = [
            Figure("configs validated", float(dry.group(1)), unit=""),
            Figure("comppo / verl-gae step", None, note=f"{launch.group(1)}"),
        ]
        return figures, [] if dry.group(1) == "2" else [f"{dry.group(1)} configs validated, expected 2"]
    step = re.search(rf"^verl step time \([^)]*\): comppo {NUMBER} s, verl-gae {NUMBER} s, ratio {NUMBER}", out, re.M)
    train = re.search(
        rf"^verl train time \([^)]*, no generation\): comppo {NUMBER} s, verl-gae {NUMBER} s, ratio {NUMBER}",
        out,
        re.M,
    )
    if not step or not train:
        return [], ["no 'verl step time' and 'verl train time' lines"]
    figures = [
        Figure("comppo / verl-gae step", float(step.group(3))),
        Figure("train (no generation)", float(train.group(3))),
        Figure("comppo step", float(step.group(1)), unit=" s"),
        Figure("verl-gae step", float(step.group(2)), unit=" s"),
    ]
    return figures, []


def trl_notes(out: str) -> list[str]:
    notes = []
    gen = re.search(r"generation: ([^;]+);", out)
    if gen:
        notes.append(f"generation: {gen.group(1).strip()}")
    for who in re.findall(r"^(grpo|comppo\w*): (DEEPSPEED.*)$", out, re.M):
        notes.append(f"{who[0]}: {who[1]}")
    return notes


# --------------------------------------------------------------------------- #
# the parts
# --------------------------------------------------------------------------- #


def importable(module: str) -> bool:
    """Whether ``module`` is installed (found, not imported: deepspeed's import is slow)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: benches/gpu_verl_step.py's exit status for "cannot run here" (its SKIP)
VERL_SKIP = 3


def verl_needs(tiny: bool) -> str:
    """What the verl part lacks here ("skipped: ..."): verl (and, on a GPU, vllm and transfer_queue)."""
    if not importable("verl"):
        return "skipped: verl not installed (pip install 'comppo-core[verl]')"
    if tiny:
        return ""
    for module, what in (("vllm", "'verl[vllm]'"), ("transfer_queue", "'verl[verl-core]'")):
        if not importable(module):
            return f"skipped: {module} not importable (pip install {what})"
    return ""


def parts() -> list[Part]:
    """The parts in table order, with their GPU budgets (seconds; 680 in all, scaled to the
    total: module docstring) and their dry runs' (a safety net: the dry run's parts share the cores)."""
    py = [sys.executable]
    bench = [*py, "-u"]
    pytest_gpu = [*py, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider"]
    trl = [*bench, "benches/gpu_trl_step.py"]
    verl = [*bench, "benches/gpu_verl_step.py"]
    return [
        Part(
            "tests/gpu",
            gpu=pytest_gpu,
            tiny=pytest_gpu,
            budget=60,  # Triton compiles the online kernel's variants on first use
            tiny_budget=35,
            parse=parse_pytest,
            tiny_env={"COMPPO_GPU_TESTS_DEVICE": "cpu"},
        ),
        Part(
            "gpu_gae",
            gpu=[*bench, "benches/gpu_gae.py"],
            tiny=[*bench, "benches/gpu_gae.py", "--device", "cpu", "--small"],
            budget=25,
            tiny_budget=20,
            parse=parse_gae,
        ),
        Part(
            "gpu_probe",
            gpu=[*bench, "benches/gpu_probe.py", "--rounds", "3"],
            tiny=[*bench, "benches/gpu_probe.py", "--device", "cpu", "--small", "--rounds", "1"],
            budget=35,
            tiny_budget=25,
            parse=parse_probe,
        ),
        Part(
            "gpu_critic",
            gpu=[*bench, "benches/gpu_critic.py", "--rounds", "3"],
            tiny=[*bench, "benches/gpu_critic.py", "--device", "cpu", "--tiny", "--threads", "1"],
            budget=25,
            tiny_budget=25,
            parse=parse_critic,
            miss_codes=(1,),
        ),
        Part(
            "gpu_train_step",
            gpu=[*bench, "benches/gpu_train_step.py", "--rounds", "1"],
            tiny=[*bench, "benches/gpu_train_step.py", "--device", "cpu", "--tiny"],
            budget=100,
            tiny_budget=45,
            parse=parse_train_step,
            miss_codes=(1,),
        ),
        Part(
            "gpu_trl_step (CompPOTrainer vs GRPOTrainer)",
            gpu=[*trl, "--rounds", "2"],  # vLLM colocate when vllm imports
            tiny=[*trl, "--device", "cpu", "--tiny"],
            budget=130,
            tiny_budget=48,
            parse=parse_trl,
            miss_codes=(1,),
        ),
        Part(
            "gpu_trl_step --zero3 (1-process ZeRO-3)",
            gpu=[*trl, "--zero3", "--rounds", "2"],
            tiny=[*trl, "--device", "cpu", "--tiny", "--zero3"],
            budget=95,
            tiny_budget=75,  # two ZeRO-3 jobs over gloo: 99 s once on a loaded 2-core host
            parse=parse_trl_zero3,
            miss_codes=(1,),
            needs=lambda tiny: "" if importable("deepspeed") else "skipped: deepspeed is not importable",
        ),
        Part(
            "gpu_verl_step (verl recipe vs verl GAE + critic)",
            gpu=verl,  # two launches of verl's trainer (Ray, vLLM, FSDP2), 2 steps each
            tiny=[*verl, "--tiny"],
            budget=210,
            tiny_budget=45,
            parse=parse_verl,
            skip_codes=(VERL_SKIP,),
            needs=verl_needs,
        ),
    ]


# --------------------------------------------------------------------------- #
# running them
# --------------------------------------------------------------------------- #


def run_part(part: Part, tiny: bool, timeout: float, logs: Path) -> Row:
    row = Row(part.name)
    why = part.needs(tiny)
    cmd = part.tiny if tiny else part.gpu
    if not tiny and not cuda_available():
        why = f"{NO_CUDA} (torch.cuda.is_available() is False; --tiny is the CPU dry run)"
    elif cmd is None:
        why = f"{NO_CUDA} (this part has no CPU dry run)"
    if why:
        row.status = why
        return row
    assert cmd is not None
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "GPU_ALL_PART_TIMEOUT": f"{timeout:.0f}",
        **part.env,
    }
    if tiny:
        env.update(part.tiny_env)
        env.setdefault("OMP_NUM_THREADS", "1")
    log = logs / (re.sub(r"[^A-Za-z0-9_.-]+", "_", part.name).strip("_") + ".log")
    row.log = str(log)
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            row.rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the part's own process group
            proc.wait()
            row.seconds = time.monotonic() - t0
            row.status = f"TIMEOUT after {timeout:.0f} s"
            row.failed = True
            return row
    row.seconds = time.monotonic() - t0
    out = log.read_text(errors="replace")
    if row.rc in part.skip_codes:  # the part found it cannot run here: its own reason, never "passed"
        said = re.findall(r"^(skipped: .+)$", out, re.M)
        row.status = said[-1] if said else f"skipped (exit {row.rc})"
        return row
    figures, problems = part.parse(out, tiny)
    row.figures = figures
    if part.parse in (parse_trl, parse_trl_zero3):
        row.notes = trl_notes(out)
        if tiny:
            row.notes.append(f"vLLM colocate: {NO_CUDA} (vllm has no CPU build)")
    bad = [f.name for f in figures if f.value is not None and not math.isfinite(f.value)]
    if bad:
        problems.append(f"not finite: {', '.join(bad)}")
    if row.rc != 0 and not (row.rc in part.miss_codes and figures and not problems):
        row.status = f"FAILED (exit {row.rc})"
        row.failed = True
    elif problems or not figures:
        row.status = f"FAILED ({'; '.join(problems) or 'no figures'})"
        row.failed = True
    else:
        row.ran = True
        row.status = "ran (dry run, CPU)" if tiny else "ran"
    return row


def schedule(ps: list[Part], tiny: bool, total: float, jobs: int, logs: Path) -> list[Row]:
    """Run ``ps`` (``jobs`` at a time), each with its budget plus what earlier parts left, all
    within ``total`` seconds."""
    budgets = [p.tiny_budget if tiny else p.budget for p in ps]
    scale = min(1.0, total / sum(budgets)) if jobs == 1 else 1.0
    budgets = [b * scale for b in budgets]
    start = time.monotonic()
    rows: list[Row | None] = [None] * len(ps)

    def one(i: int) -> Row:
        if jobs == 1:  # all that is left, less what the later parts are promised
            timeout = total - (time.monotonic() - start) - sum(budgets[i + 1 :])
        else:  # the dry run's parts share the cores: their budgets are doubled, within the total
            timeout = min(2 * budgets[i], total - (time.monotonic() - start))
        if timeout < 1:
            return Row(ps[i].name, status="FAILED (no time left of the total)", failed=True)
        row = run_part(ps[i], tiny, timeout, logs)
        print(f"[{time.monotonic() - start:6.1f} s] {row.part}: {row.status} ({row.seconds:.1f} s)", file=sys.stderr)
        return row

    # several at a time: the longest first, so that the short ones fill in at the end
    order = sorted(range(len(ps)), key=lambda i: -budgets[i]) if jobs > 1 else list(range(len(ps)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, i): i for i in order}
        for fut in concurrent.futures.as_completed(futures):
            rows[futures[fut]] = fut.result()
    return [r for r in rows if r is not None]


def table(rows: list[Row], tiny: bool) -> str:
    lines = ["| part | status | key figures | target | met? |", "|---|---|---|---|---|"]
    for r in rows:
        figures = "; ".join([*(f.shown() for f in r.figures), *r.notes]) or "—"
        targets = "; ".join(t for t in (f.target() for f in r.figures) if t) or "—"
        if not r.ran:
            met = "—"
        else:
            judged = [(f, f.met()) for f in r.figures if f.bound is not None]
            cuda_only = [f.name for f, m in judged if m is None]
            if tiny:
                met = "n/a (dry run)"
            else:
                missed = [f.name for f, m in judged if m is False]
                met = f"NO: {', '.join(missed)}" if missed else "yes"
            if cuda_only:
                met += f"; {', '.join(cuda_only)}: {NO_CUDA}"
        status = r.status + (f" ({r.seconds:.0f} s)" if r.seconds else "")
        lines.append(f"| {r.part} | {status} | {figures} | {targets} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the CPU dry run of every part (tiny shapes)")
    ap.add_argument("--total", type=float, default=None, help="seconds for all parts (default 580; --tiny 180)")
    ap.add_argument("--jobs", type=int, default=None, help="parts at a time (default 1 on a GPU, 2 with --tiny)")
    ap.add_argument("--only", default=None, help="comma-separated part names (prefixes) to run")
    ap.add_argument("--logs", default=None, help="directory for the parts' logs (default: a new temporary one)")
    ap.add_argument("--json", default=None, help="write the rows as JSON to this file")
    a = ap.parse_args(argv)
    total = a.total if a.total is not None else (180.0 if a.tiny else 580.0)
    jobs = a.jobs if a.jobs is not None else (2 if a.tiny else 1)
    ps = parts()
    if a.only:
        wanted = [w.strip() for w in a.only.split(",") if w.strip()]
        ps = [p for p in ps if any(p.name.startswith(w) for w in wanted)]
    logs = Path(a.logs) if a.logs else Path(tempfile.mkdtemp(prefix="gpu_all-"))
    logs.mkdir(parents=True, exist_ok=True)
    mode = "dry run on CPU (--tiny)" if a.tiny else "GPU"
    print(f"gpu_all: {len(ps)} parts, {mode}, {jobs} at a time, within {total:.0f} s; logs in {logs}", flush=True)
    t0 = time.monotonic()
    rows = schedule(ps, a.tiny, total, jobs, logs)
    print()
    print(table(rows, a.tiny))
    print(f"\n{time.monotonic() - t0:.1f} s in all")
    if a.tiny:
        print("(dry run: tiny shapes on CPU, so the figures say nothing about the targets)")
    for r in rows:
        if r.failed and r.log and Path(r.log).exists():
            tail = Path(r.log).read_text(errors="replace").splitlines()[-30:]
            print(f"\n--- {r.part}: last lines of {r.log}\n" + "\n".join(tail))
    if a.json:
        Path(a.json).write_text(json.dumps({"tiny": a.tiny, "rows": [r.as_dict() for r in rows]}, indent=2))
    ok = all(r.ran for r in rows if not r.status.startswith("skipped"))
    if not a.tiny:
        ok = ok and all(r.ran for r in rows) and all(f.met() is not False for r in rows for f in r.figures)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
