"""A comparison stopped by Ctrl-C, SIGTERM or a kill of its main process at a random moment of training leaves nothing
running or locked, and its rerun gives the uninterrupted run's results. Every other command stopped by Ctrl-C or SIGTERM
exits 130 or 143 within seconds with one sentence naming what it kept and the command that continues, leaving no child
and no lock."""
import json, os, random, re, shlex, signal, socket, subprocess, sys, time
from pathlib import Path

import psutil, pytest

from flowgrpo_nb.checkpoint import FolderLock
import warm  # python commands in a warm interpreter (tests/warm.py)

ARGS = ['compare', '--budget', 'smoke', '--tasks', 'geneval', '--arms', 'flow_grpo', 'dense', '--set', 'steps=8',
        'save_every=2', '--no-png']
# what a machine's speed changes
VOLATILE = re.compile(r'second|cpu|wall|time|cost_ratio|started|findings|timing|invocations')

def launch(out:Path, log:Path) -> subprocess.Popen:
    "`flowgrpo compare` on `out` in a process group (and session) of its own, as a shell or a scheduler starts it."
    with open(log, 'ab') as f:
        return warm.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', *ARGS, '--out', str(out)], stdout=f, stderr=f,
                          stdin=subprocess.DEVNULL, start_new_session=True,
                          env={**os.environ, 'OMP_NUM_THREADS': '1'})

def steps_logged(out:Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in out.glob('geneval/seed0/*/metrics.jsonl'))

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
    if isinstance(d, dict):
        return {k: v for key, x in d.items() if not VOLATILE.search(key) for k, v in values(x, f'{path}/{key}').items()}
    if isinstance(d, list): return {k: v for i, x in enumerate(d) for k, v in values(x, f'{path}/{i}').items()}
    return {path: d}

def stop(out:Path, log:Path, sig:int, rng:random.Random) -> dict:
    """Start the comparison, send `sig` to its main process at a random moment of training, and see what is left 10 s
    later."""
    before, proc = steps_logged(out), launch(out, log)
    t0 = time.monotonic()
    while steps_logged(out) <= before:  # a training step of this invocation is done
        assert proc.poll() is None and time.monotonic() - t0 < 600, log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(rng.uniform(0, 1.5))
    # fork server, workers, resource tracker
    family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    assert len(alive(family)) >= 4, family  # the command, its fork server, 2 workers (at least)
    t1 = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(30)
    while (alive(family) or in_group(proc.pid)) and time.monotonic() - t1 < 10: time.sleep(0.1)
    left = time.monotonic() - t1
    return dict(rc=rc, exit_s=None, left_s=left, alive=alive(family) + in_group(proc.pid),
                last=log.read_text().strip().splitlines()[-1])

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
            assert re.fullmatch(rf"flowgrpo compare: stopped by {re.escape(how)}: \d of 2 runs finished, "
                                rf"kept in {re.escape(str(b))} \(a stopped run resumes from its last checkpoint\); "
                                r"continue with: flowgrpo compare --budget smoke --tasks geneval --arms flow_grpo "
                                rf"dense --set steps=8 save_every=2 --no-png --out {re.escape(str(b))}",
                                r['last']), r['last']  # the command as typed: every flag (--no-png too)
        locks_free(b)
    print({k: round(v['left_s'], 1) for k, v in seen.items()})
    rest = launch(b, log)
    assert rest.wait(900) == 0, log.read_text()[-3000:]
    want, got = (values(json.loads((d/'report.json').read_text())) for d in (a, b))
    assert len(want) > 500 and got == want
    inv = json.loads((b/'report.json').read_text())['timing']['invocations']
    # the stopped invocations count their time
    assert len(inv) == 4 and all(inv[i]['wall_seconds'] > 0 for i in (0, 1, 3)), inv
    assert [i.get('stopped') for i in inv] == ['Ctrl-C (SIGINT)', 'SIGTERM', None, None]


# --- every other command: one sentence naming what was kept and the command that continues
# (fast: smoke sizes, 1 thread)

# `flowgrpo train` at smoke size, and a child that waits before step 2 until a file exists
from test_run_errors import ENV, GATED, ROOT, SMOKE

CLI = [sys.executable, '-m', 'flowgrpo_nb.cli']
# `flowgrpo pretrain` that waits before its step 3
NO_STEP = ("import pathlib, sys, time, flowgrpo_nb.tiny as t, flowgrpo_nb.cli as cli\n"
           "loss, calls = t.flow_loss, []\n"
           "def gated(*a, **k):\n"
           "    calls.append(1)\n"
           "    while len(calls) == 3 and not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\n"
           "    return loss(*a, **k)\n"
           "t.flow_loss = gated\n"
           "sys.exit(cli.main(sys.argv[2:]))")

def stop_when(proc:subprocess.Popen, ready, sig:int, err:Path) -> tuple[int, list[str], float]:
    """Send `sig` to `proc` once `ready()`; (its exit status, its stderr lines, seconds from the signal to the exit);
    none of its children left."""
    t0 = time.monotonic()
    while not ready():
        assert proc.poll() is None and time.monotonic() - t0 < 300, err.read_text()[-3000:]
        time.sleep(0.05)
    family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    t1 = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(30)
    took = time.monotonic() - t1
    assert alive(family) == [], alive(family)
    return rc, err.read_text().splitlines(), took

def one_sentence(lines:list[str], prog:str) -> str:
    "The stop's sentence: the last line of stderr, no traceback before it."
    assert lines and not any('Traceback' in l for l in lines), lines[-30:]
    assert lines[-1].startswith(f'{prog}: stopped by '), lines[-5:]
    return lines[-1]

def run_and_stop(script:str, args:list, tmp_path, ready, sig) -> tuple:
    """Run `flowgrpo ARGS` through the gating `script`, send `sig` once `ready()`; (exit code, its stop sentence,
    seconds to exit)."""
    err = tmp_path/'err.txt'
    with open(err, 'w') as f:
        proc = warm.Popen([sys.executable, '-c', script, str(tmp_path/'gate'), *args], cwd=ROOT, env=ENV,
                          stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    rc, lines, took = stop_when(proc, ready, sig, err)
    return rc, one_sentence(lines, f'flowgrpo {args[0]}'), took

def again(line:str) -> list[str]:
    "The command line after 'continue with: ', to run here."
    cmd = shlex.split(line.split('; continue with: ', 1)[1])
    assert cmd[0] == 'flowgrpo', cmd
    return CLI + cmd[1:]

def test_train_stopped_names_its_checkpoint_and_the_command_resumes_it(tmp_path):
    out = tmp_path/'r'
    args = ['train', '--out', str(out), *SMOKE, 'steps=4']
    rc, line, took = run_and_stop(GATED, args, tmp_path, lambda: (out/'checkpoints'/'ckpt-000002').exists(),
                                  signal.SIGINT)
    assert rc == 130 and took < 10, (rc, took)
    assert line == ("flowgrpo train: stopped by Ctrl-C (SIGINT): its checkpoint of step 2 is kept in "
                    f"{out}; continue with: {shlex.join(['flowgrpo', *args, '--resume'])}"), line
    with FolderLock(out, 'the test'): pass  # released
    r = warm.run(again(line), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [json.loads(l)['step'] for l in (out/'metrics.jsonl').read_text().splitlines()] == [1, 2, 3, 4]

def test_pretrain_stopped_by_sigterm_names_its_checkpoint_and_the_same_command_resumes(tmp_path):
    run = tmp_path/'p'
    args = ['pretrain', '--run-dir', str(run), '--steps', '4', '--batch-size', '2', '--save-every', '2']
    rc, line, took = run_and_stop(NO_STEP, args, tmp_path, lambda: (run/'checkpoints'/'ckpt-000002').exists(),
                                  signal.SIGTERM)
    assert rc == 143 and took < 10, (rc, took)
    assert line == (f"flowgrpo pretrain: stopped by SIGTERM: its checkpoint of step 2 is kept in {run}; continue with: "
                    f"{shlex.join(['flowgrpo', *args])}"), line
    r = warm.run(again(line), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    # step 3 logged once
    assert [json.loads(l)['step'] for l in (run/'log.jsonl').read_text().splitlines()] == [1, 2, 3, 4]

def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def listens(port:int) -> bool:
    with socket.socket() as s: return s.connect_ex(('127.0.0.1', port)) == 0

def test_app_stopped_closes_the_server_and_says_so(tmp_path):
    port, err = free_port(), tmp_path/'err.txt'
    env = ({k: v for k, v in ENV.items() if k != 'GRADIO_TEMP_DIR'}
           | dict(TMPDIR=str(tmp_path), GRADIO_ANALYTICS_ENABLED='False'))
    with open(err, 'w') as f:
        proc = warm.Popen([*CLI, 'app', '--port', str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=f, start_new_session=True)
    rc, lines, took = stop_when(proc, lambda: listens(port), signal.SIGINT, err)
    assert rc == 130 and took < 10, (rc, took)
    assert one_sentence(lines, 'flowgrpo app') == \
        f"flowgrpo app: stopped by Ctrl-C (SIGINT): the server on 127.0.0.1:{port} is closed"
    assert not listens(port) and not list(tmp_path.glob('flowgrpo-app-*'))  # the port and the temporary folder let go

# flowgrpo fidelity measures in its own process (its one child, the PNG export, is killed whole by
# `write_pngs`): in-process
def test_fidelity_stopped_says_what_it_kept(tmp_path, monkeypatch, capsys):
    from flowgrpo_nb import cli
    from flowgrpo_nb.study import fidelity_report as fr
    from flowgrpo_nb.config import preset_config
    from dataclasses import asdict
    def stop(*a, **k): os.kill(os.getpid(), signal.SIGTERM); time.sleep(10)
    monkeypatch.setattr(fr, 'fidelity_report', stop)
    t0 = time.monotonic()
    assert cli.main(['fidelity', '--out', str(tmp_path/'f'), '--seed', '3']) == 143 and time.monotonic() - t0 < 5
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"flowgrpo fidelity: stopped by SIGTERM: no result of this measurement was written to {tmp_path/'f'} "
        f"(they are written at its end); continue with: flowgrpo fidelity --out {tmp_path/'f'} --seed 3")
    comp, out = tmp_path/'c', tmp_path/'c'/'fidelity'
    for arm in ('flow_grpo', 'dense'):  # two finished runs with a checkpoint each
        (comp/'geneval'/'seed0'/arm/'checkpoints'/'ckpt-000002').mkdir(parents=True)
        (comp/'geneval'/'seed0'/arm/'config.json').write_text(json.dumps(asdict(preset_config(arm))))
        (comp/'geneval'/'seed0'/arm/'checkpoints'/'ckpt-000002'/'state.json').write_text('{}')
        (comp/'geneval'/'seed0'/arm/'summary.json').write_text('{}')
    def one_then_stop(f, d, a, cfg, trust_code=False):  # the first run measured (its file written whole), Ctrl-C in
        # the second
        if a == 'flow_grpo': raise KeyboardInterrupt  # the runs go in name order: dense first
        f.parent.mkdir(parents=True, exist_ok=True); f.write_text('{}')
        return dict(stats=[], cost=dict(total=dict(cpu_seconds=0.0)))
    monkeypatch.setattr(fr, '_run_fidelity', one_then_stop)
    assert cli.main(['fidelity', '--compare', str(comp), '--seeds', '0']) == 130
    assert capsys.readouterr().err.splitlines()[-1] == ("flowgrpo fidelity: stopped by Ctrl-C (SIGINT): "
                                                        f"1 of 2 runs measured, kept in {out}; continue with: "
                                                        f"flowgrpo fidelity --compare {comp} --seeds 0")
    with FolderLock(out, 'the test'): pass  # released

@pytest.mark.parametrize('name,target,kept', [
    ('eval-tiny', 'flowgrpo_nb.card.base_scores',
     ': nothing was kept (it writes no file: the scores are printed at its end)'),
    ('train-score', 'flowgrpo_nb.score.train_score', ': nothing was kept ({out} is written at its end)'),
    # seconds long: the command says nothing more, the CLI gives the command again
    ('demo', 'flowgrpo_nb.sampler_demo.compare_samplers', ''),
])
def test_the_short_commands_stopped_say_so_and_give_the_command_again(tmp_path, monkeypatch, capsys, name, target,
                                                                      kept):
    from flowgrpo_nb import cli
    def stop(*a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(target, stop)
    args = {'eval-tiny': ['--n', '6'], 'train-score': ['--steps', '3', '--out', str(tmp_path/'s.safetensors')],
            'demo': ['--out', str(tmp_path/'d')]}[name]
    assert cli.main([name, *args]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (f"flowgrpo {name}: stopped by Ctrl-C "
                                                        f"(SIGINT){kept.format(out=tmp_path/'s.safetensors')}; "
                                                        f"continue with: {shlex.join(['flowgrpo', name, *args])}")
