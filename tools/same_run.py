"""Train a few presets for 3 steps with a fixed seed and print each run's adapter sha256: a refactor that claims to
change nothing numerically is checked by running this before and after it.

Each case is `PRESET[:FIELD=VALUE,...]` (the default list covers the six methods, the chunked backward, the KL term
and both precision paths). A run's adapter is its last checkpoint's `pytorch_lora_weights.safetensors`; its metrics
are metrics.jsonl without the timings (`sec_*`, `cpu_*`), so the logged loss, ratio, KL and gradient shares are
checked too. The hashes hold for one machine (bf16 and fp32 kernels round differently on other CPUs): compare
tables made on the same machine.

Usage: python tools/same_run.py [--steps 3] [--save FILE] [--compare FILE [--metrics-rtol R]] [CASE ...]
--save writes the table (hashes and metrics) as JSON; --compare FILE (an earlier --save) prints every case that
differs, with the metrics that differ and by how much, and exits 1 when an adapter differs or a metric differs by more
than R relatively (default 0: bitwise)."""
import argparse, hashlib, json, os, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    'flow_grpo+smoke', 'flow_grpo+smoke:fast=true', 'flow_grpo+smoke:fast=false', 'dense+smoke', 'turning_point+smoke',
    'stepwise+smoke', 'flow_grpo+smoke:backward_pairs=3', 'flow_grpo+smoke:beta=0.01',
    'flow_grpo+smoke:beta=0.01,fast=false', 'dense+smoke:beta=0.01,backward_pairs=3', 'tempflow+smoke', 'flash+smoke',
)

def sha(b:bytes) -> str: return hashlib.sha256(b).hexdigest()

def metrics(f:Path) -> list[dict]:
    "metrics.jsonl's records without their timings."
    recs = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(('sec_', 'cpu_'))} for r in recs]

def metric_differences(a:list[dict], b:list[dict]) -> dict:
    "{key: largest relative difference} of the numbers two runs logged differently."
    out = {}
    for ra, rb in zip(a, b):
        for k in set(ra) | set(rb):
            x, y = ra.get(k), rb.get(k)
            if x == y: continue
            num = all(isinstance(v, (int, float)) for v in (x, y))
            d = abs(x - y) / max(abs(x), abs(y)) if num else float('inf')
            out[k] = max(out.get(k, 0.0), d)
    return out if len(a) == len(b) else out | {'records': float('inf')}

def run_case(case:str, steps:int, seed:int, root:Path) -> dict:
    "Train `case` for `steps` steps in a folder under `root`; its adapter's and metrics' sha256."
    preset, _, sets = case.partition(':')
    out = root/case.replace(':', '_').replace(',', '_').replace('=', '-')
    cmd = [sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--preset', preset, '--out', str(out), '--quiet', '--set',
           f'steps={steps}', f'seed={seed}', 'log_with=none', *[s for s in sets.split(',') if s]]
    env = os.environ | dict(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode: raise SystemExit(f"{case}: exit {p.returncode}\n{p.stderr[-3000:]}")
    ckpt, recs = sorted((out/'checkpoints').glob('ckpt-*'))[-1], metrics(out/'metrics.jsonl')
    return dict(adapter=sha((ckpt/'pytorch_lora_weights.safetensors').read_bytes()),
                metrics=sha(json.dumps(recs, sort_keys=True).encode()), records=recs,
                path=json.loads((out/'base.json').read_text())['precision'])

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('cases', nargs='*', default=list(CASES))
    ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--seed', type=int, default=5)
    ap.add_argument('--save'); ap.add_argument('--compare')
    ap.add_argument('--metrics-rtol', type=float, default=0.0)
    a = ap.parse_args()
    table = {}
    with tempfile.TemporaryDirectory() as d:
        for case in a.cases:
            table[case] = run_case(case, a.steps, a.seed, Path(d))
            print(f"{case:<42} {table[case]['adapter']}  metrics {table[case]['metrics'][:16]}  "
                  f"({table[case]['path']['path']})", flush=True)
    if a.save: Path(a.save).write_text(json.dumps(table, indent=1) + '\n')
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        bad = [f"{c}: adapter {old[c]['adapter'][:16]} -> {table[c]['adapter'][:16]}" for c in table
               if c in old and old[c]['adapter'] != table[c]['adapter']]
        near = []
        for c in table:
            if c in old and old[c]['metrics'] != table[c]['metrics']:
                d = metric_differences(old[c].get('records', []), table[c]['records']) or {'?': float('inf')}
                keys = ', '.join(f'{k} {v:.1e}' for k, v in sorted(d.items()))
                line = f"{c}: metrics {old[c]['metrics'][:16]} -> {table[c]['metrics'][:16]} (largest relative: {keys})"
                (bad if max(d.values()) > a.metrics_rtol else near).append(line)
        missing = [c for c in table if c not in old]
        for line in bad: print('DIFFERS', line)
        for line in near: print(f'WITHIN --metrics-rtol {a.metrics_rtol:g}', line)
        for c in missing: print('NOT IN', a.compare, c)
        if bad or missing: raise SystemExit(1)
        print(f"all {len(table)} cases' adapters identical to {a.compare}; metrics "
              + (f'within {a.metrics_rtol:g} relatively' if near else 'identical (without timings)'))

if __name__ == '__main__': main()
