"Trainer mechanisms that need processes: kill-and-resume equivalence, two processes, CLI errors."
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
# a small run: 6 steps of 2 prompts x 4 samples, K = 4, a checkpoint every step
ARGS = ['--preset', 'dense+smoke', '--quiet', '--set', 'steps=6', 'save_every=1', 'keep_last=10', 'log_with=none',
        'calib_iters=1']

def train(out, *extra, **kw):
    return subprocess.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), *ARGS, *extra],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, **kw)

def final_lora(out): return load_file(Path(out)/'checkpoints'/'ckpt-000006'/'lora.safetensors')

@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp('straight')
    r = train(out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

def test_kill_and_resume_is_exact(straight, tmp_path):
    "SIGKILL after the step-3 checkpoint, resume: the step-6 adapter equals the uninterrupted run's, bit for bit."
    out = tmp_path/'killed'
    p = subprocess.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), *ARGS], cwd=ROOT, env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    target = out/'checkpoints'/'ckpt-000003'/'state.json'
    t0 = time.time()
    while not target.exists():
        assert p.poll() is None, p.stderr.read().decode()[-3000:]
        assert time.time() - t0 < 300, 'no checkpoint at step 3 after 300 s'
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL); p.wait()
    assert not (out/'checkpoints'/'ckpt-000006').exists()
    r = train(out, '--resume')
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = final_lora(straight), final_lora(out)
    assert a.keys() == b.keys()
    for k in a: assert torch.equal(a[k], b[k]), k
    steps = [json.loads(l)['step'] for l in (out/'metrics.jsonl').read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 6

def test_two_processes_match_one(straight, tmp_path):
    "The same run under `accelerate launch --num_processes 2` reaches the same adapter up to float error."
    out = tmp_path/'two'
    r = subprocess.run([sys.executable, '-m', 'accelerate.commands.launch', '--cpu', '--num_processes', '2',
                        '--num_machines', '1', '--mixed_precision', 'no', '--dynamo_backend', 'no',
                        '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), *ARGS],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-5000:]
    a, b = final_lora(straight), final_lora(out)
    for k in a: torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)

def test_resume_with_other_config_names_fields(straight):
    r = train(straight, '--resume', '--set', 'lr=0.1', 'steps=7')
    assert r.returncode != 0 and 'differing fields: lr' in r.stderr

def test_bad_sizes_fail_before_work(tmp_path):
    r = train(tmp_path/'x', '--set', 'minibatch=3')
    assert r.returncode != 0 and 'whole minibatches of 3' in r.stderr
    assert not (tmp_path/'x'/'checkpoints').exists()

def test_corrupt_checkpoint_is_named(straight, tmp_path):
    import shutil
    out = tmp_path/'corrupt'; shutil.copytree(straight, out)
    (out/'checkpoints'/'ckpt-000006'/'lora.safetensors').write_bytes(b'\0' * 10)
    r = train(out, '--resume', '--set', 'steps=7')
    assert r.returncode != 0 and 'corrupt: lora.safetensors' in r.stderr
