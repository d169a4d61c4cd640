"""Benchmark of PNG export under load (not a test): `--calls` calls of `processes.write_pngs`, each of `--figures`
figures in a process of its own (as commands call it), `--at-once` at a time; every try is allowed `--timeout`
seconds per figure and only one try is made, so that a hang shows as one (not hidden by the retry).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/png_export.py [--calls 30] [--figures 2] [--at-once 3] [--timeout 60]

It prints one line per call (seconds, PNGs written, warnings) and then the totals: PNGs tried, written, tries that
hung (stopped at the timeout), tries that failed otherwise, the median and worst seconds of a call, and whether any
process or temporary folder of the export was left behind. The machine's load is whatever else runs on it; only
this benchmark's own processes (marked in their environment) and temporary folders (in a folder of its own) count as
left behind, so that another program exporting PNGs meanwhile (a test beside it) is not counted."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CALL = r'''
import json, sys, time, warnings
import plotly.graph_objects as go
from pathlib import Path
from flowgrpo_nb.processes import write_pngs
out, n, timeout = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
figs = {out/f'f{i}.png': go.Figure(go.Scatter(x=list(range(50)), y=[(j * (i + 3)) % 17 for j in range(50)]))
                           .update_layout(title=f'figure {i}', height=300)
        for i in range(n)}
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    ok = write_pngs(figs, timeout=timeout, tries=1)
print(json.dumps(dict(sec=time.monotonic() - t0, written=sum(ok.values()), warnings=[str(m.message) for m in w])))
'''

MARK = f'FLOWGRPO_PNG_BENCH={os.getpid()}'  # in the environment of every process this benchmark starts (inherited)

def one(i:int, root:Path, figures:int, timeout:float) -> dict:
    out = root/f'call{i}'; out.mkdir()
    env = {**os.environ, 'FLOWGRPO_PNG_BENCH': str(os.getpid()), 'TMPDIR': str(root/'tmp')}
    r = subprocess.run([sys.executable, '-c', CALL, str(out), str(figures), str(timeout)], capture_output=True,
                       text=True, timeout=timeout * figures * 3 + 120, env=env)
    if r.returncode:
        return dict(sec=None, written=0, warnings=[f'exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}'])
    d = json.loads(r.stdout.strip().splitlines()[-1])
    d['valid'] = sum((out/f'f{j}.png').is_file() and (out/f'f{j}.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
                     for j in range(figures))
    return d

def strays(tmp:Path) -> list[str]:
    """This benchmark's processes still alive (an export's child and its browser carry `MARK` in their environment; the
    browser's helpers, which clear theirs, name a folder in `tmp` on their command line) and the temporary folders its
    exports left in `tmp`."""
    me, left = os.getpid(), []
    for p in Path('/proc').iterdir():
        if p.name.isdigit() and int(p.name) != me:
            try: env, cmd = (p/'environ').read_bytes().split(b'\0'), (p/'cmdline').read_bytes()
            except OSError: continue
            if MARK.encode() in env or str(tmp).encode() in cmd: left.append(f'process {p.name}')
    return left + [str(d) for d in tmp.glob('flowgrpo-png-*')]

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--calls', type=int, default=30); ap.add_argument('--figures', type=int, default=2)
    ap.add_argument('--at-once', type=int, default=3); ap.add_argument('--timeout', type=float, default=60)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (Path(d)/'tmp').mkdir()
        with ThreadPoolExecutor(a.at_once) as ex:
            t0 = time.monotonic()
            rows = list(ex.map(lambda i: one(i, Path(d), a.figures, a.timeout), range(a.calls)))
            wall = time.monotonic() - t0
        time.sleep(0.5)  # a process killed just now is gone from /proc once reaped
        left = sorted(strays(Path(d)/'tmp'))
    for i, r in enumerate(rows):
        print(f"call {i:3d}: {r['sec'] if r['sec'] is None else round(r['sec'], 1)} s, "
              f"{r.get('valid', 0)}/{a.figures} PNGs" + ''.join(f'; {w}' for w in r['warnings']))
    ws = [w for r in rows for w in r['warnings']]
    secs = [r['sec'] for r in rows if r['sec'] is not None]
    hung = sum('did not finish' in w for w in ws)
    print(f"\n{a.calls * a.figures} PNGs tried in {a.calls} calls, {a.at_once} at a time, on {os.cpu_count()} CPUs "
          f"(load average before the end: {os.getloadavg()[0]:.2f}): {sum(r.get('valid', 0) for r in rows)} written; "
          f"{hung} hung (stopped at {a.timeout:g} s), {len(ws) - hung} other warnings or failures; a call took median "
          f"{statistics.median(secs):.1f} s, worst {max(secs):.1f} s; {wall:.0f} s in all")
    print(f"left behind: {', '.join(left) if left else 'nothing'}")
