"""Rewrite the absolute paths that committed records hold into the paths the writers record now (relative).

Before `study.record.relative_path`, a comparison logged its command with the absolute path of the folder it ran in
(`--out`), its compare.json and report config the fidelity file by absolute path, a fidelity result its comparison and
each run's checkpoint by absolute path. Each names a folder of the machine that ran it, never read back (a rebuild
takes the fidelity file from `runs/fidelity/fidelity.json`). This rewrites, as text (the rest of each file byte for
byte): `--out O` -> `--out .`, `--fidelity O/x` -> `--fidelity x`, a path `O/x` -> `x` (from the comparison's folder), a
checkpoint `O/<task>/seedN/<arm>/checkpoints/c` -> `checkpoints/c` (from the run's folder), a fidelity.json's
comparison `O` -> `..`. No file it touches is covered by a digest (checkpoints' manifests cover only checkpoint folders,
which hold no such path). The reports' pages are then rebuilt with tools/rebuild_reports.py from a committed tree.

Usage: python tools/relative_records.py [--check]   (--check writes nothing; exit 1 if some file would change)"""
import re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ABSOLUTE = re.compile(r'(?<![\w.~/-])/(?:work|tmp|home|root)/[^\s"\'`<>)]*')  # a path of the machines that ran them

def outs(text:str) -> set[str]:
    "The absolute comparison folders commands in `text` ran into (`--out O`)."
    return {o.rstrip('/') for o in re.findall(r'--out (/[^\s"\\]+)', text)}

def rewrite(text:str, out:str) -> str:
    "`text` with the paths under the comparison folder `out` written from that folder."
    o = re.escape(out)
    text = re.sub(rf'--out {o}(?=[\s"\\])', '--out .', text)
    text = re.sub(rf'--fidelity {o}/', '--fidelity ', text)
    text = re.sub(rf'"{o}/[^"/]+/seed\d+/[^"/]+/(checkpoints/[^"]*)"', r'"\1"', text)  # from the run's folder
    text = re.sub(rf'"compare": "{o}/?"', '"compare": ".."', text)  # fidelity/fidelity.json: from its folder
    return re.sub(rf'"{o}/', '"', text)

def main(argv:list[str]) -> int:
    files = subprocess.run(['git', '-C', str(ROOT), 'ls-files', 'results'], capture_output=True, text=True,
                           check=True).stdout.split()
    texts = {f: (ROOT/f).read_text() for f in files if f.endswith(('.json', '.jsonl'))}
    # each results folder's comparison folders, from every command it recorded
    folders = {}
    for f, t in texts.items(): folders.setdefault(Path(f).parts[1], set()).update(outs(t))
    changed = []
    for f, t in texts.items():
        if not ABSOLUTE.search(t): continue
        new = t
        for o in sorted(folders.get(Path(f).parts[1], ()), key=len, reverse=True): new = rewrite(new, o)
        if (left := ABSOLUTE.findall(new)): print(f"{f}: still holds {left[:2]}"); return 1
        changed.append(f)
        if '--check' not in argv: (ROOT/f).write_text(new)
    print(f"{len(changed)} files {'would change' if '--check' in argv else 'rewritten'}: " + ', '.join(changed))
    return 1 if changed and '--check' in argv else 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
