"""tests/warm.py starts a command as a new interpreter would: the same exit code, output, argv, sys.path, working
folder and environment as `subprocess` gives it, for each way a Python command can end."""
import os, signal, subprocess, sys, time
import pytest
import warm

SHOW = ("import json, os, sys\n"
        "print(json.dumps(dict(argv=sys.argv, path=sys.path[:2], cwd=os.getcwd(), env=os.environ.get('WARM_X'),"
        " main=sorted(k for k in vars(sys.modules['__main__']) if not k.startswith('__')), stdin=sys.stdin.read())))\n"
        "print('to stderr', file=sys.stderr)\n"
        "a = 1\n")
ENDINGS = {'exit 3': 'raise SystemExit(3)', 'exit message': 'raise SystemExit("why")', 'exception': '1/0',
           'ctrl-c': 'raise KeyboardInterrupt', 'atexit': 'import atexit; atexit.register(print, "bye")',
           'thread': 'import threading, time\n'
                     'threading.Thread(target=lambda: (time.sleep(0.3), print("late"))).start()'}

def both(cmd, **kw):
    "(cold, warm) results of the same command."
    cold = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
    hot = warm.run(cmd, capture_output=True, text=True, timeout=120, **kw)
    return cold, hot

@pytest.mark.parametrize('ending', ENDINGS)
def test_each_ending_is_a_new_interpreters(tmp_path, ending):
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'WARM_X': 'y', 'PYTHONPATH': str(tmp_path)}
    cold, hot = both([sys.executable, '-c', SHOW + ENDINGS[ending], 'arg'], cwd=tmp_path, env=env, input='in')
    assert warm._warm([sys.executable, '-c', ''], env)
    assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout, cold.stderr)

def test_a_module_and_a_script(tmp_path):
    (tmp_path/'mod_w.py').write_text(SHOW.replace('sys.stdin.read()', "''"))
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    for cmd in ([sys.executable, '-m', 'mod_w', 'x'], [sys.executable, str(tmp_path/'mod_w.py'), 'x']):
        cold, hot = both(cmd, cwd=tmp_path, env=env)
        assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout, cold.stderr)

def test_popen_signals_pipes_and_sessions():
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    code = "import time\ntry: print('up', flush=True); time.sleep(60)\nexcept KeyboardInterrupt: raise SystemExit(130)"
    p = warm.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    assert isinstance(p, warm.Popen) and p.stdout.readline() == 'up\n'
    assert os.getpgid(p.pid) == p.pid and p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired): p.wait(0.2)
    p.send_signal(signal.SIGINT)
    assert p.wait(30) == 130 and p.stdout.read() == ''
    p = warm.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env)
    p.kill()
    assert p.wait(30) == -signal.SIGKILL

def test_a_timeout_kills_the_command_and_its_children():
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print('started', flush=True); time.sleep(60)"
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e: warm.run([sys.executable, '-c', code], env=env, timeout=3,
                                                                 capture_output=True, text=True)
    assert time.monotonic() - t < 30 and 'started' in e.value.stdout

def test_what_it_cannot_start_faithfully_starts_cold():
    assert not warm._warm([sys.executable, '-X', 'importtime', '-c', ''], dict(os.environ))
    assert not warm._warm(['git', 'status'], dict(os.environ))
    assert not warm._warm([sys.executable, '-c', ''], {**os.environ, 'OMP_NUM_THREADS': '2'})
    assert not warm._warm([sys.executable, '-c', ''], {**os.environ, 'ATEN_CPU_CAPABILITY': 'default'})
    r = warm.run([sys.executable, '-c', 'import os; print(os.environ["OMP_NUM_THREADS"])'],
                 env={**os.environ, 'OMP_NUM_THREADS': '2'}, capture_output=True, text=True)
    assert r.stdout == '2\n'
