"Every failure of `flowgrpo train` is one sentence naming its cause, with exit status 2, before any work, leaving nothing that blocks the next try."
import errno, json, os, shutil, signal, subprocess, sys, time
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
SMOKE = ['--preset', 'flow_grpo+smoke', '--quiet', '--set', 'log_with=none', 'eval_images=0', 'save_every=1']

def flowgrpo(*args, timeout=600):
    return subprocess.run([sys.executable, '-m', 'flowgrpo_nb.cli', *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)

def refused(r, *words):
    "Exit status 2, one line on stderr containing `words`, no traceback."
    lines = [l for l in r.stderr.splitlines() if l.startswith('flowgrpo ')]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert lines and all(w in lines[-1] for w in words), (words, r.stderr[-2000:])
    return lines[-1]

@pytest.fixture(scope='module')
def run(tmp_path_factory):
    "A finished 3-step smoke run with a checkpoint every step."
    out = tmp_path_factory.mktemp('run')/'r'
    r = flowgrpo('train', '--out', out, *SMOKE, 'steps=3', 'keep_last=5')
    assert r.returncode == 0, r.stderr[-3000:]
    return out

@pytest.mark.parametrize('override,words', [
    ('lr=Infinity', ['GRPOConfig.lr=inf', 'finite']),
    ('lr=abc', ["GRPOConfig.lr='abc'", 'float']),
    ('steps=true', ["GRPOConfig.steps='true'", 'int']),
    ('K=1', ['GRPOConfig.K=1', '>= 2']),
    ('window_size=0', ['GRPOConfig.window_size=0', 'trains no step']),
    ('minibatch=3', ['GRPOConfig.minibatch=3', 'divisor']),
    ('learning_rate=1', ["override 'learning_rate=1'"]),
])
def test_bad_config_is_refused_before_any_work(tmp_path, override, words):
    out = tmp_path/'x'
    refused(flowgrpo('train', '--out', out, *SMOKE, override), *words)
    assert not out.exists()  # nothing written: the next try with a fixed value starts cleanly

def test_output_folder_is_a_file_or_under_a_file(tmp_path):
    f = tmp_path/'f'; f.write_text('')
    refused(flowgrpo('train', '--out', f, *SMOKE), str(f), 'is a file')
    refused(flowgrpo('train', '--out', f/'sub', *SMOKE), str(f))

def test_resume_without_config_names_the_file(run, tmp_path):
    out = tmp_path/'r'; shutil.copytree(run, out); (out/'config.json').unlink()
    refused(flowgrpo('train', '--out', out, '--resume', *SMOKE, 'steps=4'), 'config.json', 'does not exist')

def test_corrupt_config_names_the_file(run, tmp_path):
    out = tmp_path/'r'; shutil.copytree(run, out); (out/'config.json').write_text('{"K": 4,')
    refused(flowgrpo('train', '--out', out, '--resume', *SMOKE, 'steps=4'), str(out/'config.json'), 'not valid JSON')

def test_metrics_log_partial_last_line_resumes_damaged_middle_is_named(run, tmp_path):
    out = tmp_path/'r'; shutil.copytree(run, out)
    log = out/'metrics.jsonl'
    log.write_text(log.read_text() + '{"step": 4, "rew')  # what a kill during a write leaves
    r = flowgrpo('train', '--out', out, '--resume', *SMOKE, 'steps=4')
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(l)['step'] for l in log.read_text().splitlines()] == [1, 2, 3, 4]
    lines = log.read_text().splitlines(); lines[1] = 'garbage'; log.write_text('\n'.join(lines) + '\n')
    refused(flowgrpo('train', '--out', out, '--resume', *SMOKE, 'steps=5'), str(log), 'line 2')

def test_bit_flip_in_adapter_falls_back_to_previous_checkpoint(run, tmp_path):
    out = tmp_path/'r'; shutil.copytree(run, out)
    f = out/'checkpoints'/'ckpt-000003'/'pytorch_lora_weights.safetensors'
    b = bytearray(f.read_bytes()); b[-5] ^= 1; f.write_bytes(bytes(b))  # one bit of the payload, not the header
    r = flowgrpo('train', '--out', out, '--resume', *SMOKE, 'steps=4')
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'pytorch_lora_weights.safetensors is corrupt' in r.stderr and 'ckpt-000002' in r.stderr
    assert [json.loads(l)['step'] for l in (out/'metrics.jsonl').read_text().splitlines()] == [1, 2, 3, 4]

def test_rerun_before_first_checkpoint_starts_over(tmp_path):
    "A run killed before its first checkpoint neither blocks the next run nor leaves duplicate steps in its log."
    out = tmp_path/'r'
    p = subprocess.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), *SMOKE, 'save_every=10', 'steps=10'],
                         cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not ((out/'metrics.jsonl').exists() and len((out/'metrics.jsonl').read_text().splitlines()) >= 2):
        assert p.poll() is None and time.time() - t0 < 300
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL); p.wait()
    refused(flowgrpo('train', '--out', out, '--resume', *SMOKE), 'no checkpoint to resume from', 'without --resume')
    r = flowgrpo('train', '--out', out, *SMOKE, 'steps=3')
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(l)['step'] for l in (out/'metrics.jsonl').read_text().splitlines()] == [1, 2, 3]

def test_full_disk_is_one_sentence_and_leaves_no_partial_checkpoint(tmp_path):
    "A disk that fills up at the second checkpoint: a sentence naming the folder and the cause, no .tmp-ckpt-* left."
    child = ("import errno, sys, flowgrpo_nb.checkpoint as c, flowgrpo_nb.cli as cli\n"
             "w = c._fsync_write\n"
             "def full(path, data):\n"
             "    if 'ckpt-000002' in str(path): raise OSError(errno.ENOSPC, 'No space left on device')\n"
             "    w(path, data)\n"
             "c._fsync_write = full\n"
             "sys.exit(cli.main(sys.argv[1:]))")
    out = tmp_path/'r'
    r = subprocess.run([sys.executable, '-c', child, 'train', '--out', str(out), *SMOKE, 'steps=4'], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=600)
    refused(r, 'cannot write checkpoint', 'No space left on device')
    assert not list((out/'checkpoints').glob('.tmp-*'))
    assert [c.name for c in (out/'checkpoints').glob('ckpt-*')] == ['ckpt-000001']

def test_success_says_where_the_results_are(run):
    r = flowgrpo('train', '--out', run, '--resume', *SMOKE, 'steps=3')  # nothing left to do: still one line
    assert r.returncode == 0 and f'results in {run}' in r.stdout.splitlines()[-1] and 'no evaluation' in r.stdout
