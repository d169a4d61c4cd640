"""The small cases of a hostile test: a Ctrl-C while `compare` starts its fork server is the stop sentence alone; a
disk with no byte free names the lock file and leaves no folder."""
import errno, os, signal, subprocess, sys, time
from pathlib import Path
import psutil, pytest
from flowgrpo_nb import checkpoint
from flowgrpo_nb.checkpoint import FolderLock, CheckpointError

ROOT = Path(__file__).resolve().parent.parent

def test_ctrl_c_while_the_fork_server_imports_is_the_stop_sentence_alone(tmp_path):
    "Ctrl-C to the command's process group as soon as its fork server exists (it is still importing torch)."
    p = subprocess.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', 'compare', '--budget', 'smoke', '--tasks', 'geneval',
                          '--arms', 'flow_grpo', '--out', str(tmp_path/'c'), '--no-png'], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, 'OMP_NUM_THREADS': '1'})
    t0 = time.time()
    while not any('forkserver' in ' '.join(c.cmdline()) for c in psutil.Process(p.pid).children()):
        assert p.poll() is None and time.time() - t0 < 120, 'no fork server started'
        time.sleep(0.02)
    time.sleep(1.5)  # the server imports torch and the package meanwhile
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130 and 'Traceback' not in err, err[-3000:]
    assert [l for l in err.splitlines() if l.strip()][-1].startswith('flowgrpo'), err[-3000:]

def test_a_full_disk_at_the_lock_names_it_and_leaves_no_folder(tmp_path, monkeypatch):
    def full(fd, data, offset): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(checkpoint.os, 'pwrite', full)
    with pytest.raises(CheckpointError, match=rf"cannot write the lock file {tmp_path}/new/.lock: No space left"):
        FolderLock(tmp_path/'new')
    assert not (tmp_path/'new').exists()
    monkeypatch.undo()
    with FolderLock(tmp_path/'new'): assert (tmp_path/'new'/'.lock').exists()  # with space: taken as before
