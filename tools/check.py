"""The whole test suite, in order, stopping at the first failing stage with a message naming the culprit:

1. notebooks are committed clean (`nbdev-clean` leaves git unchanged);
2. the library is in sync with the notebooks (`nbdev-export` leaves git unchanged);
3. README.md is in sync with nbs/index.ipynb (tools/readme.py leaves git unchanged);
4. `nbdev-test` on every notebook (cells flagged slow / gpu / chrome are skipped, see `tst_flags`),
   plus the chrome-flagged cells when Debian's chromium is installed; each notebook in a process of its own, forked
   from one that has imported torch and the other heavy libraries once (tools/nbtest.py);
5. `pytest tests/` (`--dist loadfile`; the 20 slowest tests are listed); the Python commands the tests start run in
   a warm interpreter that has imported torch & co. once per worker (tests/warm.py; FLOWGRPO_TEST_COLD=1 starts
   each in a new one).

Both test stages start the longest notebooks and test files first, so that the two workers finish together: the
seconds each took are kept in tools/test_times.json (`--record-times` rewrites it from this run; one never recorded
starts first of all, larger files first).

It ends with one line `N passed, N failed` counting notebooks and pytest tests together, and exits non-zero on failure.
Usage: python tools/check.py [--fast] [--record-times] (--fast skips pytest tests marked slow)."""
import json, os, re, shutil, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT/'.venv'/'bin'
passed = failed = 0
TIMES = ROOT/'tools'/'test_times.json'  # seconds per notebook and per test file, from a recorded run

def recorded_times() -> dict:
    try: return json.loads(TIMES.read_text())
    except (OSError, ValueError): return {}

def longest_first(paths:list, times:dict) -> list:
    "`paths` by their recorded seconds, longest first; those never recorded before them, larger files first."
    def key(p):
        t = times.get(str(Path(p).resolve().relative_to(ROOT)))
        return (t is not None, -(t or 0), -Path(p).stat().st_size, str(p))
    return sorted(paths, key=key)

def record_times(new:dict):
    "Merge `new` seconds into tools/test_times.json, written whole."
    merged = {k: round(v, 1) for k, v in {**recorded_times(), **new}.items()}
    with tempfile.NamedTemporaryFile('w', dir=TIMES.parent, suffix='.tmp', delete=False) as f:
        json.dump(dict(sorted(merged.items())), f, indent=1); f.write('\n')
    os.replace(f.name, TIMES)

def run(cmd, **kw): return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)

def git_changes(*paths):
    "Paths under `paths` that differ from HEAD (modified, added or deleted), untracked files included."
    out = run(['git', 'status', '--porcelain', '--', *paths]).stdout
    return [l[3:] for l in out.splitlines() if l.strip()]

def finish(msg=None):
    if msg: print(f'\nFAILED: {msg}', flush=True)
    print(f'{passed} passed, {failed} failed', flush=True)
    sys.exit(1 if (failed or msg) else 0)

def stage(name): print(f'== {name}', flush=True)

def check_unchanged(name, cmd, paths, hint):
    "Run `cmd`; fail naming the changed files if it changed anything under `paths` that was clean before."
    global passed
    stage(name)
    before = set(git_changes(*paths))
    r = run(cmd)
    if r.returncode:
        finish(f'{name}: `{" ".join(map(str, cmd))}` exited {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}')
    changed = sorted(set(git_changes(*paths)) - before)
    if changed: finish(f'{name}: running `{" ".join(map(str, cmd))}` changed {", ".join(changed)}. {hint}')
    passed += 1

def notebooks():
    nbs = sorted(p for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts
                 and not p.name.startswith('_'))
    return [p for p in nbs if not (p.parent/'.notest').exists()]

def test_notebooks(nbs:list, flags='') -> list:
    """`nbdev-test` on each of `nbs` (in this order, FLOWGRPO_TEST_WORKERS at a time) by tools/nbtest.py: [(notebook,
    ok, seconds, output)], sorted by notebook."""
    cmd = [str(BIN/'python'), str(ROOT/'tools'/'nbtest.py'), '--workers', os.environ.get('FLOWGRPO_TEST_WORKERS', '2'),
           *(['--flags', flags] if flags else []), *map(str, nbs)]
    r = run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    results = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{')]
    done = {Path(d['nb']) for d in results}
    if r.returncode or done != set(map(Path, nbs)):
        finish(f'tools/nbtest.py exited {r.returncode} with {len(nbs) - len(done)} notebooks untested\n'
               f'{r.stdout[-3000:]}{r.stderr[-3000:]}')
    return sorted((Path(d['nb']), d['ok'], d['seconds'], d['output']) for d in results)

def have_chromium(): return shutil.which('chromium') is not None or Path('/usr/bin/chromium').exists()

def main():
    global passed, failed
    fast, record = '--fast' in sys.argv, '--record-times' in sys.argv
    check_unchanged('notebooks are clean', [str(BIN/'nbdev-clean')], ['nbs'],
                    'Run `nbdev-clean` and commit the cleaned notebooks.')
    check_unchanged('library in sync with notebooks', [str(BIN/'nbdev-export')], ['flowgrpo_nb'],
                    'flowgrpo_nb/ was edited by hand or not re-exported: the notebook named in the changed '
                    "file's header (`# AUTOGENERATED! ... File to edit: ../nbs/NAME.ipynb`) is the source; "
                    "run `nbdev-export` and commit.")
    check_unchanged('README in sync with nbs/index.ipynb', [str(BIN/'python'), 'tools/readme.py'], ['README.md'],
                    'Run `python tools/readme.py` (or `nbdev-readme` where Quarto exists) and commit README.md.')
    flags = 'chrome' if have_chromium() else ''
    stage(f'nbdev-test on every notebook (skipping slow gpu{"" if flags else " chrome"})')
    nbs = longest_first(notebooks(), recorded_times())
    results = test_notebooks(nbs, flags)
    if record: record_times({str(nb.relative_to(ROOT)): secs for nb, _, secs, _ in results})
    bad = []
    for nb, ok, secs, out in results:
        print(f'  {"ok  " if ok else "FAIL"} {nb.relative_to(ROOT)} ({secs:.0f}s)', flush=True)
        if ok: passed += 1
        else: failed += 1; bad.append((nb, out))
    for nb, out in bad: print(f'\n--- {nb.relative_to(ROOT)} ---\n{out[-6000:]}', flush=True)
    if bad: finish('nbdev-test failed in ' + ', '.join(str(nb.relative_to(ROOT)) for nb, _ in bad))
    stage('pytest tests/')
    workers = os.environ.get('FLOWGRPO_TEST_WORKERS', '2')
    cmd = [str(BIN/'python'), '-m', 'pytest', 'tests', '-q', '-p', 'no:cacheprovider', '-rfE', '-n', workers, '--dist',
           'loadfile', '--durations=20']
    skip = (['slow'] if fast else []) + ([] if have_chromium() else ['chrome'])
    if skip: cmd += ['-m', ' and '.join(f'not {m}' for m in skip)]
    # tests/conftest.py orders the files longest first, and writes each file's seconds where FLOWGRPO_TEST_TIMES says
    times_out = Path(tempfile.mkdtemp())/'times.json'
    env = {**os.environ, 'OMP_NUM_THREADS': '1', **({'FLOWGRPO_TEST_TIMES': str(times_out)} if record else {})}
    r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, env=env)
    if record and times_out.is_file(): record_times(json.loads(times_out.read_text()))
    print(r.stdout[-20000:], r.stderr[-5000:], flush=True)
    counts = {k: int(n) for n, k in re.findall(r'(\d+) (passed|failed|error|errors)',
                                               r.stdout.splitlines()[-1] if r.stdout.strip() else '')}
    passed += counts.get('passed', 0)
    failed += counts.get('failed', 0) + counts.get('error', 0) + counts.get('errors', 0)
    if r.returncode not in (0,): finish(f'pytest exited {r.returncode}: see the failures listed above')
    finish()

if __name__ == '__main__': main()
