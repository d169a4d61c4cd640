"""Keep the small files of a comparison's finished runs: what its report is built from, without the checkpoints.

A study runs for hours, in pieces, possibly on different machines. This copies, from a comparison folder (`flowgrpo
compare --out SRC`), every finished run's own files (config.json, base.json, calibration.json, summary.json,
metrics.jsonl), the base model's cached evaluations, the fidelity results (`flowgrpo fidelity --compare SRC`),
compare.json and the log of invocations into DST, in the same layout. `flowgrpo compare --budget B --out DST` then
reuses those runs (a finished run is one with its summary; its base weights are checked from base.json) and rebuilds the
report from them, training only what is missing. Unfinished runs, checkpoints and TensorBoard logs are left out.

Usage: python tools/keep_runs.py SRC DST"""
import shutil, sys
from pathlib import Path

def keep(src:Path, dst:Path) -> dict:
    n = dict(runs=0, files=0, skipped=0)
    for d in sorted(src.glob('*/seed*/*')):
        if d.parent.parent.name in ('base', 'fidelity') or not d.is_dir(): continue
        if not (d/'summary.json').is_file(): n['skipped'] += 1; continue
        for f in d.iterdir():
            if f.is_file() and not f.name.startswith('.'):
                (dst/f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dst/f.relative_to(src)); n['files'] += 1
        n['runs'] += 1
    for f in [src/'compare.json', src/'invocations.jsonl', *(src/'base').rglob('*.json'),
              *(src/'fidelity').rglob('*.json')]:
        if f.is_file() and not f.name.startswith('.'):
            (dst/f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst/f.relative_to(src)); n['files'] += 1
    return n

if __name__ == '__main__':
    if len(sys.argv) != 3: sys.exit(__doc__.splitlines()[-1])
    src, dst = map(Path, sys.argv[1:])
    if not (src/'compare.json').is_file():
        sys.exit(f"{src}: not a comparison folder (no compare.json; flowgrpo compare --out writes it)")
    n = keep(src, dst)
    print(f"kept {n['runs']} finished runs ({n['files']} files) from {src} in {dst}; {n['skipped']} "
          "unfinished left out")
