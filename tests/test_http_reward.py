"""A reward over HTTP against `flowgrpo reward-serve` on loopback (issue 63 item 4): the scores are the in-process
reward's, a served reward trains the embedded default as the in-process one does (bit for bit), a server that is down
is one sentence, and a run whose server is killed mid-run stops with one sentence and resumes exactly once it is back.
Every server a test starts is stopped in a `finally`; ports are picked free (the server binds port 0 and prints it)."""
import json, os, re, signal, subprocess, sys, time
from contextlib import contextmanager
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1', 'FLOWGRPO_REWARD_RETRIES': '2'}
STEPS = 3

@contextmanager
def reward_server(spec:str, port:int=0):
    "`flowgrpo reward-serve SPEC` in its own process; yields its URL; always stopped."
    p = warm.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', 'reward-serve', spec, '--port', str(port)], cwd=ROOT,
                   env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # the server's one line, once it listens
        m = re.search(r'at (http://127\.0\.0\.1:\d+/)', line)
        assert m, f"reward-serve said {line!r}, stderr {p.stderr.read() if p.poll() is not None else ''}"
        yield m.group(1), p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        p.stdout.close(); p.stderr.close()

def train_cmd(out, reward, *extra, steps=STEPS):
    return [sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), '--preset', 'flow_grpo+smoke',
            '--quiet', '--reward', reward, '--set', f'steps={steps}', 'save_every=1', 'keep_last=50', 'eval_images=8',
            'log_with=none', *extra]

def run(cmd, ok=True):
    r = warm.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert (r.returncode == 0) == ok, r.stderr[-3000:]
    return r

def state(out, step:int) -> dict:
    "Every tensor of checkpoint `step`, and the log's training rows up to it without timings and evaluations."
    ck = Path(out)/'checkpoints'/f'ckpt-{step:06d}'
    st = {f.name: load_file(f) for f in ck.glob('*.safetensors')}
    rows = [{k: v for k, v in json.loads(l).items() if not k.startswith(('sec_', 'cpu_', 'eval_'))}
            for l in (Path(out)/'metrics.jsonl').read_text().splitlines() if l.strip()]
    st['metrics'] = [r for r in rows if len(r) > 1 and r.get('step', 0) <= step]
    return st

def assert_same(a:dict, b:dict):
    assert a.keys() == b.keys() and a['metrics'] == b['metrics'] and a['metrics']
    for name in a:
        if name != 'metrics':
            for k in a[name]: assert torch.equal(a[name][k], b[name][k]), f'{name}: {k} differs'

@pytest.fixture(scope='module')
def in_process(tmp_path_factory):
    "The straight run with the in-process reward."
    out = tmp_path_factory.mktemp('in_process')
    run(train_cmd(out, 'partial'))
    return out

def test_served_scores_equal_the_in_process_reward():
    from flowgrpo_nb.task import geneval_task
    from flowgrpo_nb.http_reward import HttpReward
    task = geneval_task('partial+score')
    imgs, ps = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0)), task.train_prompts[:6]
    with reward_server('partial+score') as (url, _):
        got = HttpReward(url)(imgs, ps)
    assert torch.equal(got, task.reward(imgs, ps))

def test_a_served_reward_trains_as_the_in_process_one(in_process, tmp_path):
    with reward_server('partial') as (url, _):
        run(train_cmd(tmp_path, url, steps=2))
    assert json.loads((tmp_path/'config.json').read_text())['reward'] == url
    assert_same(state(tmp_path, 2), state(in_process, 2))

def test_server_down_is_one_sentence(tmp_path):
    with reward_server('partial') as (url, _): pass  # its port, now closed
    r = run(train_cmd(tmp_path/'run', url), ok=False)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr
    assert f'the reward server {url} did not answer' in lines[0] and '--resume' in lines[0]
    assert not list((tmp_path/'run').glob('checkpoints/ckpt-*'))

def test_a_killed_server_stops_the_run_and_it_resumes_exactly(in_process, tmp_path):
    with reward_server('partial') as (url, server):
        trainer = warm.Popen(train_cmd(tmp_path, url), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        try:
            t0 = time.monotonic()
            while not (tmp_path/'checkpoints'/'ckpt-000001').exists() and trainer.poll() is None:
                assert time.monotonic() - t0 < 600, 'no first checkpoint'
                time.sleep(0.02)
            server.kill()
            _, err = trainer.communicate(timeout=600)
        finally:
            if trainer.poll() is None: trainer.kill(); trainer.wait()
    assert trainer.returncode != 0 and 'Traceback' not in err, err
    assert f'the reward server {url} did not answer' in err.strip().splitlines()[-1]
    assert not (tmp_path/'checkpoints'/f'ckpt-{STEPS:06d}').exists()
    port = int(url.rsplit(':', 1)[1].strip('/'))
    with reward_server('partial', port) as (url2, _):
        assert url2 == url
        run(train_cmd(tmp_path, url, '--resume'))
    assert_same(state(tmp_path, STEPS), state(in_process, STEPS))
