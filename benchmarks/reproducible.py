"""The reproducible mode (`flowgrpo train --reproducible`, 02b_precision): what it costs here, and its digest.

Three parts, each in child processes (the mode's settings are read when torch loads, so every measurement starts a
Python of its own), on one thread, at `nice`:

1. each setting of the mode alone, then all of them, on the tiny model's fp32 eager calls (`precision.probe_call`: a
   forward without gradient of 32 rows, a forward + backward of 16): process CPU ms per row, and whether its numbers
   are bitwise those of the default (a setting that changes nothing here cannot be told from one that is not read);
2. whole training steps of the smoke preset, the default fp32 eager path against the mode, alternating (default,
   mode, default, ...) with the same seeds so that a slow spell of the machine falls on both: medians and ranges of
   the process CPU seconds of the rollout, the update and the step (the first step of each run left out: warm-up);
3. the digest: each run of the mode is the fixed smoke run `DIGEST_RUN`; the sha256 of its final adapter and of its
   metrics (timings aside) must be the same in every run, and the same as in results/machines/reproducible_digest.json
   (recorded on the CPU kind it names). It prints matched / did not match and adds a line to the file's `checks`
   (this CPU, the instruction caps in the environment, torch, the code); `--record` writes the digest anew.

Example (~5 minutes of CPU on an AMD EPYC with AVX2 only), and the same digest under the AVX2 caps:

    nice -n 10 .venv/bin/python benchmarks/reproducible.py
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 nice -n 10 .venv/bin/python benchmarks/reproducible.py \\
        --digest-only --note 'AVX2 caps in the environment'

On a new kind of CPU, `--digest-only` (two runs of the mode, a few minutes) says whether the digest matched there.
"""
import hashlib, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
from fastcore.script import call_parse

from flowgrpo_nb.checkpoint import write_json
from flowgrpo_nb.processes import REPRODUCIBLE_ENV
from flowgrpo_nb.precision import machine_key, ISA_LIMITS
from flowgrpo_nb.study.record import code_version

ROOT = Path(__file__).resolve().parent.parent
COST, DIGEST = ROOT/'results/machines/reproducible_cost.json', ROOT/'results/machines/reproducible_digest.json'
DIGEST_RUN = ['train', '--preset', 'smoke', '--no-base-eval', '--quiet', '--set', 'log_with=none']
MODES = dict(default=['fast=False'], reproducible=['--reproducible'])  # added to DIGEST_RUN (fast=False: fp32 eager)
PHASES = ('rollout', 'update', 'step')
TIMINGS = ('sec_', 'cpu_', 'wall')  # what a step logs that measures the machine, not the computation
# each setting of the mode alone (the variables; oneDNN off is a torch flag the child sets), then the mode
SETTINGS = dict(default={}, **{f'{k}={v}': {k: v} for k, v in REPRODUCIBLE_ENV.items() if 'THREADS' not in k},
                onednn_off=dict(NO_ONEDNN='1'), mode=REPRODUCIBLE_ENV | dict(NO_ONEDNN='1'))

_PROBE = r"""
import hashlib, json, os, time, torch
torch.set_num_threads(1); torch.manual_seed(0)
if os.environ.get('NO_ONEDNN'): torch.backends.mkldnn.enabled = False
from flowgrpo_nb.precision import probe_policy, probe_call, PROBE_ROWS
pol, out, h = probe_policy().set_fast(False), {}, hashlib.sha256()
for kind, n in PROBE_ROWS.items():
    f = probe_call(pol, kind, n); f()
    ts = []
    for _ in range(5):
        c = time.process_time(); f(); ts.append(time.process_time() - c)
    out[kind] = 1e3 * sorted(ts)[2] / n
for p in pol.trainable_parameters(): h.update(p.grad.numpy().tobytes())  # the backward's gradients, summed 6 times
print(json.dumps(dict(out, capability=torch.backends.cpu.get_cpu_capability(), bits=h.hexdigest()[:16])))
"""

def child_env(extra:dict) -> dict:
    "This environment on one thread, with `extra` over it."
    return {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', **extra}

def probe(setting:str) -> dict:
    "Process CPU ms per row of the fp32 eager calls, and their numbers' hash, in a child with `setting`."
    r = subprocess.run([sys.executable, '-c', _PROBE], env=child_env(SETTINGS[setting]), capture_output=True,
                       text=True, timeout=900)
    if r.returncode: raise SystemExit(f"the probe of {setting} failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])

def train(mode:str, out:Path) -> Path:
    "The smoke run of `mode` in `out`, by the command line in a child process."
    args = DIGEST_RUN + MODES[mode] if mode == 'default' else DIGEST_RUN[:-2] + MODES[mode] + DIGEST_RUN[-2:]
    r = subprocess.run([sys.executable, '-m', 'flowgrpo_nb.cli', *args, '--out', str(out)],
                       env=child_env({}), capture_output=True, text=True, timeout=1800)
    if r.returncode: raise SystemExit(f"the {mode} run failed: {r.stderr.strip().splitlines()[-1:]}")
    return out

def rows(run:Path) -> list[dict]: return [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines() if l]

def digest(run:Path) -> dict:
    "sha256 of the run's final adapter file and of its metrics (timings aside); its final held-out score."
    ckpt = sorted((run/'checkpoints').iterdir())[-1]
    metrics = [{k: v for k, v in r.items() if not k.startswith(TIMINGS)} for r in rows(run)]
    summary = json.loads((run/'summary.json').read_text())
    return dict(adapter_sha256=hashlib.sha256((ckpt/'pytorch_lora_weights.safetensors').read_bytes()).hexdigest(),
                metrics_sha256=hashlib.sha256(json.dumps(metrics, sort_keys=True).encode()).hexdigest(),
                final_eval=summary['final']['eval_overall'], steps=summary['steps'])

def spread(xs:list) -> dict: return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs))

def machine() -> dict:
    m = machine_key()
    return dict(cpu=m['cpu'], capability=m['capability'], torch=m['torch'], **{k: m[k] for k in ISA_LIMITS})

def cost_table(runs:dict, m:dict, reps:int, settings:dict):
    "Print the training phases' CPU seconds of both modes, and write them with the settings' to results/machines/."
    steps = {mode: {p: spread([s[f'cpu_{p}'] for s in runs[mode]]) for p in PHASES} for mode in MODES}
    head = ' '.join(f"{mode + ' median [range]':>30}" for mode in MODES)
    print(f"\n{'phase (CPU s)':<14} {head}   mode/default")
    for p in PHASES:
        cells = [f"{steps[mo][p]['median']:.3f} [{steps[mo][p]['min']:.3f}, {steps[mo][p]['max']:.3f}]" for mo in MODES]
        print(f"{p:<14} " + ' '.join(f"{c:>30}" for c in cells)
              + f"   {steps['reproducible'][p]['median'] / steps['default'][p]['median']:.2f}x")
    write_json(COST, dict(machine=m, measured=time.strftime('%Y-%m-%d %H:%M:%S'), threads=1, code=code_version(),
                          command=f'benchmarks/reproducible.py --reps {reps}', run=['flowgrpo', *DIGEST_RUN],
                          settings=settings, steps=steps, runs_per_mode=reps))

def check_digest(digests:list, m:dict, record:bool, note:str):
    "Check the mode's runs against each other and against the digest file (or record it there); a line in the file."
    same = all(g == digests[0] for g in digests)
    print(f"\n{len(digests)} runs of the mode: {'bitwise the same' if same else 'NOT the same'}: {digests[0]}")
    check = dict(**m, code=code_version(), date=time.strftime('%Y-%m-%d'), note=note, runs=len(digests),
                 runs_alike=same)
    if record or not DIGEST.exists():
        write_json(DIGEST, dict(run=['flowgrpo', *DIGEST_RUN, '--reproducible'], **digests[0], recorded_on=m,
                                code=code_version(), checks=[check | dict(matched=same)]))
        print(f"digest recorded on {m['cpu']} ({m['capability']}) in {DIGEST.relative_to(ROOT)}")
    else:
        kept = json.loads(DIGEST.read_text())
        matched = same and all(digests[0][k] == kept[k] for k in ('adapter_sha256', 'metrics_sha256'))
        write_json(DIGEST, kept | dict(checks=kept['checks'] + [check | dict(matched=matched)]))
        print(f"the digest recorded on {kept['recorded_on']['cpu']} ({kept['recorded_on']['capability']}): "
              f"{'matched' if matched else 'did not match'} on {m['cpu']} ({m['capability']})")

@call_parse
def main(reps:int=3,             # smoke runs of each mode (alternating; the mode's must be alike)
         digest_only:bool=False,  # only the mode's runs: the digest's check (no cost measured, none written)
         record:bool=False,       # write the digest anew from this machine's runs
         note:str=''):            # said beside this check in the digest file (e.g. 'AVX2 caps in the environment')
    "Print the mode's cost per setting and per training phase, write results/machines/, check the digest."
    if reps < 1 + digest_only: raise SystemExit(f"--reps {reps}: at least {1 + digest_only}")
    m, t0 = machine(), time.time()
    print(f"CPU: {m['cpu']} (torch's kernels here: {m['capability']}; torch {m['torch']}; "
          + ', '.join(f"{k}={m[k] or 'unset'}" for k in ISA_LIMITS) + ')', flush=True)
    settings = {}
    if not digest_only:
        print(f"\n{'setting':<28} {'forward ms/row':>14} {'update ms/row':>14} {'x default':>10}  bits as default")
        for s in SETTINGS:
            settings[s] = p = probe(s)
            d = settings['default']
            x = (2 * p['forward'] + p['update']) / (2 * d['forward'] + d['update'])  # a step's 2 : 1 (02b_precision)
            print(f"{s:<28} {p['forward']:>14.3f} {p['update']:>14.3f} {x:>9.2f}x  {p['bits'] == d['bits']}",
                  flush=True)
    modes = ['reproducible'] if digest_only else list(MODES)
    runs, digests = {mode: [] for mode in modes}, []
    with tempfile.TemporaryDirectory() as d:
        for r in range(reps):
            for mode in modes:
                run = train(mode, Path(d)/f'{mode}{r}')
                runs[mode] += rows(run)[1:]
                if mode == 'reproducible': digests.append(digest(run))
    if not digest_only: cost_table(runs, m, reps, settings)
    check_digest(digests, m, record, note)
    print(f"({time.time() - t0:.0f} s)")
