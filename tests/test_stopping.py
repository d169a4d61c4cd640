"A comparison stopped by Ctrl-C, SIGTERM or a kill of its main process at a random moment of training leaves nothing running or locked, and its rerun gives the uninterrupted run's results."
import json, os, random, re, signal, subprocess, sys, time
from pathlib import Path

import psutil, pytest

from flowgrpo_nb.checkpoint import FolderLock

ARGS = ['compare', '--budget', 'smoke', '--tasks', 'geneval', '--arms', 'flow_grpo', 'dense', '--set', 'steps=8', 'save_every=2', '--no-png']
VOLATILE = re.compile(r'second|cpu|wall|time|cost_ratio|started|findings|timing|invocations')  # what a machine's speed changes

def launch(out:Path, log:Path) -> subprocess.Popen:
    "`flowgrpo compare` on `out` in a process group (and session) of its own, as a shell or a scheduler starts it."
    with open(log, 'ab') as f:
        return subprocess.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', *ARGS, '--out', str(out)], stdout=f, stderr=f,
                                stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})

def steps_logged(out:Path) -> int: return sum(len(p.read_text().splitlines()) for p in out.glob('geneval/seed0/*/metrics.jsonl'))

def alive(procs:list) -> list:
    "The processes of `procs` still running (a zombie is gone: it only waits to be reaped)."
    def up(p):
        try: return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error: return False
    return [p for p in procs if up(p)]

def in_group(pgid:int) -> list:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE: out.append(p)
        except (OSError, psutil.Error): pass
    return out

def values(d, path='') -> dict:
    "report.json flattened to {path: value}, without what depends on the machine's speed."
    if isinstance(d, dict): return {k: v for key, x in d.items() if not VOLATILE.search(key) for k, v in values(x, f'{path}/{key}').items()}
    if isinstance(d, list): return {k: v for i, x in enumerate(d) for k, v in values(x, f'{path}/{i}').items()}
    return {path: d}

def stop(out:Path, log:Path, sig:int, rng:random.Random) -> dict:
    "Start the comparison, send `sig` to its main process at a random moment of training, and see what is left 10 s later."
    before, proc = steps_logged(out), launch(out, log)
    t0 = time.monotonic()
    while steps_logged(out) <= before:  # a training step of this invocation is done
        assert proc.poll() is None and time.monotonic() - t0 < 600, log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(rng.uniform(0, 1.5))
    family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)  # fork server, workers, resource tracker
    assert len(alive(family)) >= 4, family  # the command, its fork server, 2 workers (at least)
    t1 = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(30)
    while (alive(family) or in_group(proc.pid)) and time.monotonic() - t1 < 10: time.sleep(0.1)
    left = time.monotonic() - t1
    return dict(rc=rc, exit_s=None, left_s=left, alive=alive(family) + in_group(proc.pid), last=log.read_text().strip().splitlines()[-1])

def locks_free(out:Path):
    for d in [out, *out.glob('geneval/seed0/*')]:
        with FolderLock(d, 'the test'): pass  # FolderLocked (a ValueError) if a process still holds it

@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='process groups, /proc')
def test_a_stopped_comparison_leaves_nothing_and_resumes_to_the_same_results(tmp_path):
    rng = random.Random(40)
    a, b, log = tmp_path/'straight', tmp_path/'stopped', tmp_path/'log.txt'
    straight = launch(a, tmp_path/'straight.txt')
    assert straight.wait(900) == 0, (tmp_path/'straight.txt').read_text()[-3000:]
    seen = {}
    for sig, status in [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)]:
        r = seen[sig.name] = stop(b, log, sig, rng)
        assert r['alive'] == [] and r['left_s'] < 10, r
        assert r['rc'] == status, r
        if sig != signal.SIGKILL:
            how = 'Ctrl-C (SIGINT)' if sig == signal.SIGINT else 'SIGTERM'
            assert re.fullmatch(rf"flowgrpo compare: stopped by {re.escape(how)}: \d of 2 runs finished, kept in {re.escape(str(b))} "
                                rf"\(a stopped run resumes from its last checkpoint\); continue with: flowgrpo compare --budget smoke --out {re.escape(str(b))} "
                                r"--tasks geneval --arms flow_grpo dense --set steps=8 save_every=2", r['last']), r['last']
        locks_free(b)
    print({k: round(v['left_s'], 1) for k, v in seen.items()})
    rest = launch(b, log)
    assert rest.wait(900) == 0, log.read_text()[-3000:]
    want, got = (values(json.loads((d/'report.json').read_text())) for d in (a, b))
    assert len(want) > 500 and got == want
    inv = json.loads((b/'report.json').read_text())['timing']['invocations']
    assert len(inv) == 4 and all(inv[i]['wall_seconds'] > 0 for i in (0, 1, 3)), inv  # the stopped invocations count their time
    assert [i.get('stopped') for i in inv] == ['Ctrl-C (SIGINT)', 'SIGTERM', None, None]
