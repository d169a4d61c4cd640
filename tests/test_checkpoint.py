"""Failure cases of flowgrpo_nb.checkpoint (nbs/00c_checkpoint.ipynb teaches the same functions)."""
import errno, json, os, time, warnings
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file, load_file

import flowgrpo_nb.checkpoint as ck
from flowgrpo_nb.checkpoint import (CheckpointError, MetricsLog, check_output_dir, clean_interrupted, flatten_optimizer,
                                    latest_checkpoint, list_checkpoints, read_checkpoint, read_json,
                                    unflatten_optimizer, verify_checkpoint, write_checkpoint, write_json, FolderLock,
                                    FolderLocked, LOCK_FILE, RunFolder)
import warm  # python commands in a warm interpreter (tests/warm.py)

torch.set_num_threads(1)
LORA = {'to_q.lora_A.weight': torch.arange(24.).reshape(4, 6) / 100, 'to_q.lora_B.weight': torch.ones(6, 4)}


def _files(step, **extra):
    return {'lora.safetensors': {k: v * step for k, v in LORA.items()}, 'config.json': dict(method='dense', K=10),
            'state.json': dict(step=step, psi=[0.7, 0.5]), **extra}


def _entries(run):
    return sorted(os.listdir(Path(run)/'checkpoints'))


def _flip(path, at=-3):
    data = bytearray(path.read_bytes()); data[at] ^= 0x01; path.write_bytes(bytes(data))


def _oserror(code):
    return OSError(code, os.strerror(code))


# ---------------------------------------------------------------- writing

def test_roundtrip_records_every_file_and_keeps_the_newest(tmp_path):
    writer = lambda d: save_file(LORA, d/'pytorch_lora_weights.safetensors')
    for s in (1, 2, 3): write_checkpoint(tmp_path, s, _files(s, adapter=writer), keep_last=2)
    assert _entries(tmp_path) == ['ckpt-000002', 'ckpt-000003']
    c = list_checkpoints(tmp_path)[-1]
    state = json.loads((c/'state.json').read_text())
    assert sorted(state['files']) == ['config.json', 'lora.safetensors', 'pytorch_lora_weights.safetensors']
    assert 'state.json' not in state['files'] and state['step'] == 3 and state['psi'] == [0.7, 0.5]
    for name, rec in state['files'].items(): assert rec['size'] == (c/name).stat().st_size and len(rec['sha256']) == 64
    d = read_checkpoint(c)
    torch.testing.assert_close(d['lora.safetensors']['to_q.lora_A.weight'], LORA['to_q.lora_A.weight'] * 3)
    torch.testing.assert_close(d['pytorch_lora_weights.safetensors']['to_q.lora_B.weight'], LORA['to_q.lora_B.weight'])
    assert d['config.json'] == dict(method='dense', K=10) and d['state.json']['step'] == 3
    assert list(read_checkpoint(c, ('config.json',))) == ['config.json']


def test_rewriting_a_step_replaces_it_and_steps_sort_as_numbers(tmp_path):
    write_checkpoint(tmp_path, 5, _files(5))
    write_checkpoint(tmp_path, 5, _files(7))
    assert _entries(tmp_path) == ['ckpt-000005']
    torch.testing.assert_close(read_checkpoint(list_checkpoints(tmp_path)[0])['lora.safetensors']['to_q.lora_B.weight'],
                               LORA['to_q.lora_B.weight'] * 7)
    write_checkpoint(tmp_path, 1_000_000, _files(1), keep_last=5)
    assert [c.name for c in list_checkpoints(tmp_path)] == ['ckpt-000005', 'ckpt-1000000']


@pytest.mark.parametrize('kw,msg', [
    (dict(step=-1), 'step=-1'), (dict(step=2.0), 'step=2.0'), (dict(keep_last=0), 'keep_last=0'),
    (dict(files={'a/b.json': {}}), "'a/b.json'"), (dict(files={'.hidden.json': {}}), "'.hidden.json'"),
    (dict(files={'w.safetensors': {'a': [1, 2]}}), 'dict of name -> tensor'), (dict(files={'w.pt': {}}), "'w.pt'"),
    (dict(files={'state.json': dict(files=1)}), "without a 'files' key"),
    (dict(files={'state.json': lambda d: None}), 'not a writer'), (dict(files=[('a.json', 1)]), 'must be a dict')])
def test_bad_arguments_are_refused_before_writing(tmp_path, kw, msg):
    args = dict(run_dir=tmp_path/'run', step=1, files=_files(1), keep_last=2) | kw
    with pytest.raises(ValueError, match=msg.replace('.', r'\.').replace('(', r'\(')): write_checkpoint(**args)
    assert not (tmp_path/'run').exists()


@pytest.mark.parametrize('at', ['lora.safetensors', 'config.json', 'state.json'])
def test_disk_full_is_one_sentence_and_leaves_no_tmp_folder(tmp_path, monkeypatch, at):
    write_checkpoint(tmp_path, 1, _files(1))
    real = ck._fsync_write
    def full(path, data):
        if Path(path).name == at: raise _oserror(errno.ENOSPC)
        return real(path, data)
    monkeypatch.setattr(ck, '_fsync_write', full)
    with pytest.raises(CheckpointError, match=r'cannot write checkpoint .*ckpt-000002: No space left on device') as e:
        write_checkpoint(tmp_path, 2, _files(2))
    assert isinstance(e.value, ValueError)
    assert _entries(tmp_path) == ['ckpt-000001']
    read_checkpoint(list_checkpoints(tmp_path)[0])  # the earlier checkpoint is intact


def test_disk_full_inside_a_writer_raising_safetensors_error(tmp_path):
    def writer(d):
        (d/'pytorch_lora_weights.safetensors').write_bytes(b'half')
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')
    with pytest.raises(CheckpointError, match='No space left on device'):
        write_checkpoint(tmp_path, 3, _files(3, adapter=writer))
    assert _entries(tmp_path) == []


def test_read_only_folder(tmp_path, monkeypatch):
    run = tmp_path/'run'; (run/'checkpoints').mkdir(parents=True)
    if os.geteuid() == 0:  # root ignores permission bits: simulate the mount refusing the new folder
        real = Path.mkdir
        def ro(self, *a, **k):
            if self.name.startswith('.tmp-'): raise _oserror(errno.EROFS)
            return real(self, *a, **k)
        monkeypatch.setattr(Path, 'mkdir', ro)
        msg = 'Read-only file system'
    else:
        (run/'checkpoints').chmod(0o500); msg = 'Permission denied'
    try:
        with pytest.raises(CheckpointError, match=f'cannot write checkpoint .*ckpt-000001: {msg}'):
            write_checkpoint(run, 1, _files(1))
    finally: (run/'checkpoints').chmod(0o700)
    assert _entries(run) == []


def test_interrupt_inside_a_writer_propagates_and_cleans_up(tmp_path):
    def writer(d):
        (d/'pytorch_lora_weights.safetensors').write_bytes(b'half')
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt): write_checkpoint(tmp_path, 1, _files(1, adapter=writer))
    assert _entries(tmp_path) == []


def test_failed_final_rename_puts_the_replaced_checkpoint_back(tmp_path, monkeypatch):
    write_checkpoint(tmp_path, 4, _files(4))
    real, calls = os.replace, []
    def replace(a, b):
        calls.append(Path(a).name)
        if Path(a).name.startswith('.tmp-'): raise _oserror(errno.EIO)
        return real(a, b)
    monkeypatch.setattr(os, 'replace', replace)
    with pytest.raises(CheckpointError, match='Input/output error'): write_checkpoint(tmp_path, 4, _files(9))
    monkeypatch.undo()
    assert _entries(tmp_path) == ['ckpt-000004'] and calls[0] == 'ckpt-000004'
    torch.testing.assert_close(
        read_checkpoint(tmp_path/'checkpoints'/'ckpt-000004')['lora.safetensors']['to_q.lora_B.weight'],
        LORA['to_q.lora_B.weight'] * 4)


# ---------------------------------------------------------------- verifying and resuming

def test_bit_flip_in_a_payload_is_an_error_and_resume_falls_back(tmp_path):
    for s in (1, 2): write_checkpoint(tmp_path, s, _files(s))
    new = list_checkpoints(tmp_path)[-1]
    _flip(new/'lora.safetensors')
    assert set(load_file(new/'lora.safetensors')) == set(LORA)  # safetensors alone would not notice
    with pytest.raises(CheckpointError, match='ckpt-000002: lora.safetensors is corrupt .its sha256 differs'):
        read_checkpoint(new)
    read_checkpoint(new, ('config.json',))  # the other files still verify
    read_checkpoint(new, verify=False)
    with pytest.warns(UserWarning, match='lora.safetensors is corrupt.*resuming from ckpt-000001 instead'):
        assert latest_checkpoint(tmp_path).name == 'ckpt-000001'
    _flip(list_checkpoints(tmp_path)[0]/'config.json', at=3)
    with pytest.raises(CheckpointError,
                       match='no intact checkpoint in .*ckpt-000002.*ckpt-000001: config.json is corrupt'):
        latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path/'elsewhere') is None


def test_truncated_missing_and_unreadable_files(tmp_path):
    c = write_checkpoint(tmp_path, 1, _files(1))
    (c/'lora.safetensors').write_bytes((c/'lora.safetensors').read_bytes()[:40])
    with pytest.raises(CheckpointError, match=r'lora.safetensors is corrupt \(40 bytes instead of'):
        verify_checkpoint(c)
    with pytest.raises(CheckpointError, match='cannot be read'): read_checkpoint(c, verify=False)
    (c/'config.json').unlink()
    with pytest.raises(CheckpointError, match='incomplete: config.json is missing'):
        read_checkpoint(c, ('config.json',))
    with pytest.raises(CheckpointError, match='has no ema.safetensors'): read_checkpoint(c, ('ema.safetensors',))
    (c/'state.json').write_text('{"step": 1, "fil')
    with pytest.raises(CheckpointError, match='ckpt-000001: state.json cannot be read'): read_checkpoint(c)
    with pytest.raises(CheckpointError, match='is not a checkpoint'): read_checkpoint(tmp_path)


def test_checkpoint_without_checksums_is_read_with_a_warning(tmp_path):
    c = tmp_path/'checkpoints'/'ckpt-000003'; c.mkdir(parents=True)
    save_file(LORA, c/'lora.safetensors'); (c/'state.json').write_text(json.dumps(dict(step=3)))
    with pytest.warns(UserWarning, match='without checksums'): d = read_checkpoint(c)
    assert sorted(d) == ['lora.safetensors', 'state.json']
    with pytest.warns(UserWarning, match='without checksums'): assert latest_checkpoint(tmp_path) == c


def test_clean_interrupted(tmp_path):
    root = tmp_path/'checkpoints'
    write_checkpoint(tmp_path, 1, _files(1)); write_checkpoint(tmp_path, 2, _files(2))
    (root/'.tmp-ckpt-000003-77').mkdir(); (root/'.tmp-ckpt-000003-77'/'lora.safetensors').write_bytes(b'half')
    os.replace(root/'ckpt-000002', root/'.old-ckpt-000002-77')       # killed between the two renames
    (root/'.old-ckpt-000001-78').mkdir()                               # a stale copy next to its checkpoint
    (tmp_path/'.tmp-config.json-77').write_text('{"K"')                # a write_json killed before its rename
    assert [c.name for c in list_checkpoints(tmp_path)] == ['ckpt-000001']
    removed = clean_interrupted(tmp_path)
    assert sorted(p.name for p in removed) == ['.old-ckpt-000001-78', '.tmp-ckpt-000003-77', '.tmp-config.json-77']
    assert not (tmp_path/'.tmp-config.json-77').exists()
    assert _entries(tmp_path) == ['ckpt-000001', 'ckpt-000002']
    assert latest_checkpoint(tmp_path).name == 'ckpt-000002'
    assert clean_interrupted(tmp_path) == [] and clean_interrupted(tmp_path/'none') == []


def test_optimizer_round_trip_continues_identically(tmp_path):
    def make():
        ps = [torch.nn.Parameter(v.clone()) for v in LORA.values()]
        return ps, torch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.95))
    def step(ps, opt):
        opt.zero_grad(); sum((p ** 3).sum() for p in ps).backward(); opt.step()
    p1, o1 = make()
    for _ in range(3): step(p1, o1)
    t, meta = flatten_optimizer(o1)
    d = read_checkpoint(write_checkpoint(tmp_path, 3, {'optimizer.safetensors': t, 'optimizer.json': meta}))
    p2, o2 = make()
    with torch.no_grad():
        for a, b in zip(p2, p1): a.copy_(b)
    o2.load_state_dict(unflatten_optimizer(d['optimizer.safetensors'], d['optimizer.json']))
    step(p1, o1); step(p2, o2)
    for a, b in zip(p1, p2): assert torch.equal(a, b)


# ---------------------------------------------------------------- metrics log

def _log(tmp_path, n=5):
    log = MetricsLog(tmp_path/'metrics.jsonl')
    for s in range(n): log.append(dict(step=s, reward=s / 10))
    return log


@pytest.mark.parametrize('tail', [b'{"step": 5, "rew', b'{"step": 5, "reward": 0.5\n', b'\x00\x00\x00'])
def test_partial_last_line_is_dropped_with_a_warning(tmp_path, tail):
    with open(_log(tmp_path).path, 'ab') as f: f.write(tail)  # the run is killed; a new process opens the log
    log = MetricsLog(tmp_path/'metrics.jsonl')
    with pytest.warns(UserWarning, match='line 6: dropped a partial last line'):
        assert [r['step'] for r in log.read()] == list(range(5))
    with pytest.warns(UserWarning): log.append(dict(step=5, reward=0.5))
    assert [r['step'] for r in log.read()] == list(range(6))  # the new row is not glued to the fragment


def test_unterminated_but_whole_last_line_is_kept(tmp_path):
    path = _log(tmp_path).path
    path.write_bytes(path.read_bytes().rstrip(b'\n'))
    log = MetricsLog(path)
    assert len(log.read()) == 5
    log.append(dict(step=5))
    assert [r['step'] for r in log.read()] == list(range(6))


def test_corruption_before_the_last_line_names_file_and_line(tmp_path):
    log = _log(tmp_path)
    lines = log.path.read_bytes().split(b'\n'); lines[1] = b'{"step": 1, "rew'
    log.path.write_bytes(b'\n'.join(lines))
    with pytest.raises(CheckpointError, match=r'metrics log .*metrics.jsonl, line 2: not a JSON object'): log.read()
    log.path.write_bytes(b'[1, 2]\n{"step": 0}\n')
    with pytest.raises(CheckpointError, match='line 1'): log.read()


def test_truncate_on_resume_and_restart(tmp_path):
    log = _log(tmp_path, 8)
    assert [r['step'] for r in log.truncate(4)] == list(range(5))
    for s in range(5, 8): log.append(dict(step=s))
    steps = [r['step'] for r in log.read()]
    assert steps == list(range(8)) and len(set(steps)) == len(steps)
    assert log.truncate(None) == [] and log.read() == [] and log.path.exists()
    assert MetricsLog(tmp_path/'none.jsonl').truncate(3) == [] and not (tmp_path/'none.jsonl').exists()
    log.path.write_text('{"step": 0}\n{"reward": 1}\n')
    with pytest.raises(CheckpointError, match="row 2 has no integer 'step'"): log.truncate(3)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.tmp-')]


def test_append_failures_are_one_sentence(tmp_path):
    with pytest.raises(CheckpointError, match='cannot append to metrics log .*No such file or directory'):
        MetricsLog(tmp_path/'missing'/'metrics.jsonl').append(dict(step=0))
    with pytest.raises(ValueError, match='must be a dict'): MetricsLog(tmp_path/'m.jsonl').append([1])


# ---------------------------------------------------------------- JSON and output folders

def test_read_json_names_the_file_and_what_it_is(tmp_path):
    f = write_json(tmp_path/'config.json', dict(lr=1e-4))
    assert read_json(f, 'run config') == dict(lr=1e-4)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.tmp-')]
    f.write_text('')
    with pytest.raises(ValueError, match=r'run config .*config.json is not valid JSON \(Expecting value: line 1 '
                                         r'column 1'):
        read_json(f, 'run config')
    f.write_text('{"lr": 1e-4, "K"')
    with pytest.raises(ValueError, match='config.json is not valid JSON'): read_json(f)
    with pytest.raises(ValueError, match='base record .*base.json does not exist'):
        read_json(tmp_path/'base.json', 'base record')
    with pytest.raises(ValueError, match='is a folder'): read_json(tmp_path)
    with pytest.raises(CheckpointError, match='cannot write summary .*No such file or directory'):
        write_json(tmp_path/'no'/'summary.json', {}, 'summary')


def test_check_output_dir(tmp_path, monkeypatch):
    assert check_output_dir(tmp_path/'a'/'b', need_bytes=1000) == tmp_path/'a'/'b'
    assert not (tmp_path/'a').exists()
    (tmp_path/'f').write_text('x')
    with pytest.raises(ValueError, match='output folder .*f is a file'): check_output_dir(tmp_path/'f')
    with pytest.raises(ValueError, match=r'cannot be created: .*f is a file'): check_output_dir(tmp_path/'f'/'g'/'h')
    with pytest.raises(ValueError, match=r'has .* free and the command needs about'):
        check_output_dir(tmp_path, need_bytes=10**18)
    monkeypatch.chdir(tmp_path)
    assert check_output_dir('runs/x') == Path('runs/x')
    monkeypatch.setattr(os, 'access', lambda p, mode: False)  # what a non-root user sees on a folder of someone else
    with pytest.raises(ValueError, match='cannot be written: .* not writable by this user'):
        check_output_dir(tmp_path/'new')
    class RO:
        f_flag = os.ST_RDONLY
    monkeypatch.setattr(os, 'statvfs', lambda p: RO())
    with pytest.raises(ValueError, match='on a read-only file system'): check_output_dir(tmp_path/'new')


# ---------------------------------------------------------------- the writer's lock

def test_lock_refuses_another_process_and_takes_over_after_it_is_killed(tmp_path, lock_holder):
    run = tmp_path/'run'
    child = lock_holder(run, 'a comparison')
    with pytest.raises(FolderLocked,
                       match=rf"^{run} is being written by another process \(a comparison, PID {child.pid}, since "):
        FolderLock(run, 'a trainer')
    child.kill(); child.wait()  # SIGKILL: the kernel drops its lock, the file with its record stays
    assert json.loads((run/LOCK_FILE).read_text())['pid'] == child.pid
    with pytest.warns(UserWarning, match=rf'\(a comparison, PID {child.pid}\) ended without letting go of it'):
        lock = FolderLock(run, 'a trainer')
    assert json.loads((run/LOCK_FILE).read_text()) | dict(since=None) == \
        dict(pid=os.getpid(), what='a trainer', since=None)
    lock.release(); lock.release()  # a second release does nothing
    assert not (run/LOCK_FILE).exists() and run.is_dir()


def test_lock_is_reentrant_in_a_process_and_counts_its_holders(tmp_path):
    with FolderLock(tmp_path, 'a trainer') as a:
        b = FolderLock(tmp_path, 'a trainer')
        b.release()
        assert (tmp_path/LOCK_FILE).exists()  # `a` still holds it
    assert not a.held and not (tmp_path/LOCK_FILE).exists()
    with FolderLock(tmp_path/'new'/'run'): pass
    assert not (tmp_path/'new'/'run').exists()  # made by the lock, nothing written: removed (its parent is not)


def _race(folder, start):
    """A forked child: wait for `start`, try the lock; exit 0 holding it (for a while, then killed by os._exit), 3 when
    refused."""
    while not start.exists(): time.sleep(0.001)
    try: lock = FolderLock(folder, 'a racer')  # kept: a lock nobody refers to is released
    except FolderLocked: os._exit(3)
    except BaseException: os._exit(4)
    time.sleep(1.0)
    os._exit(0 if lock.held else 5)


def test_one_of_many_processes_racing_for_a_lock_gets_it(tmp_path):
    start, pids = tmp_path/'go', []
    for _ in range(4):
        pid = os.fork()
        if pid == 0: _race(tmp_path/'run', start)
        pids.append(pid)
    start.touch()
    codes = sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids)
    assert codes == [0, 3, 3, 3], codes


def test_a_forked_child_shares_the_lock_and_leaves_its_file(tmp_path, lock_holder):
    lock = FolderLock(tmp_path, 'a comparison')
    pid = os.fork()
    if pid == 0:  # the child: its copy of the lock lets go, the parent's must stay
        lock.release(); os._exit(0)
    os.waitpid(pid, 0)
    assert lock.held and json.loads((tmp_path/LOCK_FILE).read_text())['pid'] == os.getpid()
    import subprocess, sys
    r = warm.run([sys.executable, '-c', 'import sys; from flowgrpo_nb.checkpoint import FolderLock; '
                                        'FolderLock(sys.argv[1])', str(tmp_path)],
                 capture_output=True, text=True)
    assert r.returncode == 1 and f'(a comparison, PID {os.getpid()}' in r.stderr
    lock.release()


# ---------------------------------------------------------------- the run folder

def test_run_folder_reads_an_older_run_as_the_trainer_wrote_it(tmp_path):
    "A folder written before RunFolder existed (json.dumps by hand, no base.json, a torn last log line) reads the same."
    (tmp_path/'config.json').write_text(json.dumps(dict(method='dense', K=4), indent=1))
    (tmp_path/'calibration.json').write_text(json.dumps(dict(psi=[0.5, 0.4, 0.0, 0.0], history=[])))
    (tmp_path/'summary.json').write_text(json.dumps(dict(steps=2, calibration_cost=None), indent=1))
    (tmp_path/'metrics.jsonl').write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.6}\n{"step": 3, "rew')
    write_checkpoint(tmp_path, 2, {'lora.safetensors': LORA, 'state.json': dict(step=2)})
    run = RunFolder(tmp_path)
    assert run.is_run() and run.config() == dict(method='dense', K=4) and run.fingerprint() is None
    with pytest.warns(UserWarning, match='line 3: dropped a partial last line'):
        assert [m['step'] for m in run.metrics()] == [1, 2]
    assert run.summary()['steps'] == 2 and run.calibration()['psi'][0] == 0.5
    assert [c.name for c in run.checkpoints()] == ['ckpt-000002'] == [run.latest_checkpoint().name]
    before = {f: (tmp_path/f).read_bytes() for f in ('config.json', 'calibration.json', 'summary.json')}
    # the same bytes back: the format is kept
    for name in ('config', 'calibration', 'summary'): run.write(name, run.read(name))
    assert {f: (tmp_path/f).read_bytes() for f in before} == before


def test_run_folder_errors_name_the_file(tmp_path):
    run = RunFolder(tmp_path/'run')
    assert (run.summary(), run.calibration(), run.fingerprint(), run.metrics(), run.checkpoints()) == \
        (None, None, None, [], [])
    with pytest.raises(ValueError, match=r"not a trainer run folder \(.*config.json does not exist\)"): run.config()
    run.write('config', dict(K=4)); run.file('summary').write_text('[1, 2]')
    with pytest.raises(ValueError, match=r'the run summary .*summary.json holds a list, not a JSON object'):
        run.summary()
    run.file('base').write_text('{"fingerprint": ')
    with pytest.raises(ValueError, match=r'the run base .*base.json is not valid JSON'): run.fingerprint()
    assert RunFolder(RunFolder(run.path)).path == run.path and Path(run) == run.path  # a RunFolder is a path-like
