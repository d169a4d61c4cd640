"""Trainer runs through the CLI killed by SIGKILL, once a checkpoint exists or in the middle of writing one, then
resumed: the same final state as the straight run of tests/test_train.py (a file of its own, so that the two share the
work of the two pytest workers; the straight runs are trained once for both)."""
import random, signal, subprocess, sys, time
from pathlib import Path
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_train import ROOT, ENV, STEPS, cmd, train, final_state, assert_same_run, straight_runs
import warm  # python commands in a warm interpreter (tests/warm.py)

@pytest.fixture(scope='session')
def straight(shared_cache): return straight_runs(shared_cache)

# the child of a kill test: the CLI with every checkpoint file write slowed by 0.3 s, so that a kill can land
# inside a write
SLOW_WRITES = ("import sys, time, flowgrpo_nb.checkpoint as c, flowgrpo_nb.cli as cli\n"
               "w = c._fsync_write\n"
               "def slow(*a): w(*a); time.sleep(0.3)\n"
               "c._fsync_write = slow\n"
               "sys.exit(cli.main(sys.argv[1:]))")

def _kill_at(out, method, when):
    """Start a run and SIGKILL it: `when` = ('ckpt', n) once checkpoint n exists, or ('write', n) while checkpoint n is
    being written."""
    kind, n = when
    child = cmd(out, method) if kind == 'ckpt' else [sys.executable, '-c', SLOW_WRITES, *cmd(out, method)[3:]]
    p = warm.Popen(child, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root, t0 = Path(out)/'checkpoints', time.time()
    while True:
        assert p.poll() is None, p.stderr.read().decode()[-3000:]
        assert time.time() - t0 < 600, f'no {when} after 600 s'
        names = {c.name for c in root.iterdir()} if root.is_dir() else set()
        if kind == 'ckpt' and f'ckpt-{n:06d}' in names: break
        if kind == 'write' and any(x.startswith(f'.tmp-ckpt-{n:06d}') for x in names): break
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL); p.wait()
    return names

_rng = random.Random(0)  # seeded "random moments": the same kill points in every CI run
KILLS = [('flow_grpo', ('ckpt', _rng.randint(2, STEPS - 3))), ('flow_grpo', ('write', _rng.randint(2, STEPS - 3))),
         ('stepwise', ('write', _rng.randint(2, STEPS - 3))), ('dense', ('write', _rng.randint(2, STEPS - 3))),
         ('turning_point', ('ckpt', _rng.randint(2, STEPS - 3)))]

@pytest.mark.parametrize('method,when', KILLS)
def test_resume_after_sigkill_is_exact(straight, tmp_path, method, when):
    """SIGKILL once a checkpoint exists or in the middle of writing one, resume: the same final state as the straight
    run."""
    seen = _kill_at(tmp_path, method, when)
    if when[0] == 'write': assert any(x.startswith('.tmp-') for x in seen), seen  # the kill did land inside a write
    assert not (tmp_path/'checkpoints'/f'ckpt-{STEPS:06d}').exists()
    train(tmp_path, method, '--resume')
    assert_same_run(final_state(straight[method]), final_state(tmp_path))
    assert not list((tmp_path/'checkpoints').glob('.tmp-*')), 'the interrupted write was not cleaned up'
