"""The `flowgrpo` entry point, run as a user runs it: the installed console script, in a subprocess."""
import os, shutil, subprocess, sys
from pathlib import Path

import pytest

from flowgrpo_nb import cli

FLOWGRPO = shutil.which('flowgrpo', path=str(Path(sys.executable).parent)) or shutil.which('flowgrpo')
pytestmark = pytest.mark.skipif(FLOWGRPO is None, reason='the flowgrpo console script is not installed')


def flowgrpo(*args, env=None, cwd=None, timeout=600):
    e = dict(os.environ, OMP_NUM_THREADS='1', **(env or {}))
    e.pop('FLOWGRPO_DEBUG', None) if 'FLOWGRPO_DEBUG' not in (env or {}) else None
    return subprocess.run([FLOWGRPO, *args], capture_output=True, text=True, env=e, cwd=cwd, timeout=timeout)


def own_lines(stderr:str) -> list[str]:
    "stderr without third-party logger chatter printed at import (transformers' '[transformers] ...' notices)."
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith('[transformers]')]


def test_help_lists_every_command_fast():
    r = flowgrpo('--help', timeout=60)
    assert r.returncode == 0 and r.stderr == ''
    for name in cli.COMMANDS: assert f'\n  {name}' in r.stdout
    assert flowgrpo().stdout == r.stdout  # no command: the same list


def test_demo_succeeds_quietly(tmp_path):
    r = flowgrpo('demo', '--out', str(tmp_path/'demo'))
    assert r.returncode == 0, r.stderr
    assert own_lines(r.stderr) == []  # nothing of the returned rows on stderr
    assert 'flow_sde' in r.stdout and (tmp_path/'demo'/'samplers.html').is_file()
    assert (tmp_path/'demo'/'samplers.png').read_bytes()[:4] == b'\x89PNG'


def test_bad_flag_value_is_one_sentence():
    r = flowgrpo('eval-tiny', '--guidance', 'nan', '--n', '6')
    assert r.returncode == 2
    assert own_lines(r.stderr) == ['flowgrpo eval-tiny: --guidance nan: must be a finite number']
    assert r.stdout == ''


def test_malformed_flag_is_argparse_status_2():
    r = flowgrpo('demo', '--out')
    assert r.returncode == 2 and 'expected one argument' in r.stderr and 'Traceback' not in r.stderr


def test_unknown_command():
    r = flowgrpo('fly', '--fast')
    assert r.returncode == 2
    assert r.stderr.splitlines() == \
        [f"flowgrpo: unknown command 'fly'; the commands are {', '.join(cli.COMMANDS)} (flowgrpo --help)"]


def test_os_error_is_one_sentence(tmp_path):
    (tmp_path/'taken').write_text('a file, not a folder')
    r = flowgrpo('demo', '--out', str(tmp_path/'taken'))
    assert r.returncode == 2
    assert own_lines(r.stderr) == [f"flowgrpo demo: {tmp_path/'taken'} is a file, not a folder"]


@pytest.mark.parametrize('how', ['flag', 'env'])
def test_debug_shows_the_traceback(how):
    args, env = ((['eval-tiny', '--debug', '--guidance', 'nan'], None) if how == 'flag'
                 else (['eval-tiny', '--guidance', 'nan'], dict(FLOWGRPO_DEBUG='1')))
    r = flowgrpo(*args, env=env)
    assert r.returncode == 2
    lines = own_lines(r.stderr)
    assert (lines[0] == 'Traceback (most recent call last):'
            and 'ValueError: --guidance nan: must be a finite number' in lines)
    assert lines[-1] == 'flowgrpo eval-tiny: --guidance nan: must be a finite number'


def _fake(monkeypatch, fn):
    monkeypatch.setitem(cli.COMMANDS, 'fake', 'x.fake')
    monkeypatch.setattr(cli, '_command', lambda name: fn)


def test_interrupt_exits_130_with_one_line(monkeypatch, capsys):
    def fake(steps:int=3):
        "A command the user interrupts."
        raise KeyboardInterrupt
    _fake(monkeypatch, fake)
    assert cli.main(['fake']) == 130
    assert capsys.readouterr().err == 'flowgrpo fake: stopped by Ctrl-C (SIGINT); continue with: flowgrpo fake\n'


def test_sigterm_exits_143_with_one_line_and_the_commands_own_sentence(monkeypatch, capsys):
    import os, signal, time
    from flowgrpo_nb.processes import Stopped
    def fake(steps:int=3):
        "A command a scheduler stops."
        os.kill(os.getpid(), signal.SIGTERM); time.sleep(10)
    _fake(monkeypatch, fake)
    t0 = time.monotonic()
    assert cli.main(['fake']) == 143 and time.monotonic() - t0 < 5
    assert capsys.readouterr().err == 'flowgrpo fake: stopped by SIGTERM; continue with: flowgrpo fake\n'
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # as before main
    def says(steps:int=3):
        "A command that says what finished."
        raise Stopped(signal.SIGTERM, 'stopped by SIGTERM: 2 of 9 runs finished')
    _fake(monkeypatch, says)
    assert cli.main(['fake']) == 143
    assert capsys.readouterr().err == 'flowgrpo fake: stopped by SIGTERM: 2 of 9 runs finished\n'


def test_errors_become_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    from flowgrpo_nb.checkpoint import CheckpointError
    for exc, line in [(CheckpointError('checkpoint /r/ckpt-000002: lora.safetensors is corrupt\n(sha256)'),
                       'checkpoint /r/ckpt-000002: lora.safetensors is corrupt (sha256)'),
                      (OSError(28, 'No space left on device', '/runs/x/metrics.jsonl'),
                       '/runs/x/metrics.jsonl: No space left on device')]:
        def fake(exc=exc): raise exc
        _fake(monkeypatch, fake)
        assert cli.main(['fake']) == 2
        assert capsys.readouterr().err == f'flowgrpo fake: {line}\n'
    def buggy(): raise TypeError('a bug')
    _fake(monkeypatch, buggy)
    with pytest.raises(TypeError): cli.main(['fake'])


def test_warnings_are_one_line(tmp_path):
    (tmp_path/'warns.py').write_text("""
import sys, warnings
from flowgrpo_nb import cli
def fake():
    "A command that warns."
    warnings.warn('runs/x/figures/a.png: PNG skipped: the export (kaleido) did not finish in 20 s')
cli.COMMANDS['fake'] = '__main__.fake'
sys.exit(cli.main(['fake']))
""")  # a file, not -c: fastcore's parser reads the command's source for its option help
    r = subprocess.run([sys.executable, str(tmp_path/'warns.py')], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    assert r.stderr == ('flowgrpo fake: warning: runs/x/figures/a.png: PNG skipped: the export (kaleido) '
                        'did not finish in 20 s\n')


def test_compare_starts_the_fork_server_of_its_workers_first(monkeypatch):
    """flowgrpo compare starts the server its workers fork from before its own imports; other commands, --help and
    --estimate do not."""
    import multiprocessing.forkserver as fs
    from flowgrpo_nb import cli
    from flowgrpo_nb.study.pool import WORKER_PRELOAD, start_fork_server
    started = []
    monkeypatch.setattr(fs, 'ensure_running', lambda: started.append(list(fs._forkserver._preload_modules)))
    for name, argv in (('train', []), ('compare', ['--help']), ('compare', ['--estimate'])):
        cli._start_fork_server(name, argv)
    assert started == []
    cli._start_fork_server('compare', ['--seeds', '0'])
    assert started == [WORKER_PRELOAD] and cli.FORK_SERVER['compare'] == start_fork_server.__module__


def test_a_stop_closes_open_progress_bars_first(monkeypatch, capsys):
    from tqdm import tqdm
    def fake(steps:int=3):
        "A command stopped with a progress bar open."
        bar = tqdm(total=3, desc='training'); bar.update(1)
        raise KeyboardInterrupt
    _fake(monkeypatch, fake)
    assert cli.main(['fake']) == 130
    err = capsys.readouterr().err
    # the sentence on a line of its own
    assert (err.endswith('\nflowgrpo fake: stopped by Ctrl-C (SIGINT); continue with: flowgrpo fake\n')
            and 'training' in err), repr(err)

def test_train_help_lists_every_preset(capsys):
    """`flowgrpo train --help` names every key of `PRESETS` (flow_grpo_ddim, tempflow and flash included): the list is
    PRESETS'."""
    from flowgrpo_nb.config import PRESETS
    with pytest.raises(SystemExit): cli.main(['train', '--help'])
    text = ' '.join(capsys.readouterr().out.split())
    missing = [p for p in PRESETS if p not in text.replace(',', ' ').split()]
    assert not missing, f'presets missing from train --help: {missing}'
