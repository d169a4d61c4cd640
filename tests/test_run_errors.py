"""Every failure of `flowgrpo train` is one sentence naming its cause, with exit status 2, before any work, leaving
nothing that blocks the next try."""
import errno, json, os, shutil, signal, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import pytest
from flowgrpo_nb import cli
from flowgrpo_nb.checkpoint import RunFolder, LOCK_FILE
from flowgrpo_nb.config import preset_config
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
SMOKE = ['--preset', 'flow_grpo+smoke', '--quiet', '--set', 'log_with=none', 'eval_images=0', 'save_every=1']

def flowgrpo(*args, timeout=600):
    return warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', *map(str, args)], cwd=ROOT, env=ENV,
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
    # a typo: accelerate's trackers listed
    ('log_with=tensorbord', ["GRPOConfig.log_with='tensorbord'", 'wandb']),
    # the diffusers backends' option
    ('gradient_checkpointing=true', ['GRPOConfig.gradient_checkpointing=True', "model='tiny'"]),
])
def test_bad_config_is_refused_before_any_work(tmp_path, capsys, override, words):
    """In this process (`cli.main`, what the console script runs: a subprocess each would import torch again, 8 CPU s,
    for the same dispatcher that tests/test_cli.py runs as a subprocess)."""
    out = tmp_path/'x'
    capsys.readouterr()
    rc = cli.main(['train', '--out', str(out), *SMOKE, override])
    refused(subprocess.CompletedProcess([], rc, '', capsys.readouterr().err), *words)
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
    p = warm.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), *SMOKE, 'save_every=10',
                    'steps=10'], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not ((out/'metrics.jsonl').exists() and len((out/'metrics.jsonl').read_text().splitlines()) >= 1):
        assert p.poll() is None and time.time() - t0 < 300
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL); p.wait()
    refused(flowgrpo('train', '--out', out, '--resume', *SMOKE), 'no checkpoint to resume from', 'without --resume')
    r = flowgrpo('train', '--out', out, *SMOKE, 'steps=2')
    assert r.returncode == 0, r.stderr[-2000:]
    # the killed run's step 1 is gone: no step twice
    assert [json.loads(l)['step'] for l in (out/'metrics.jsonl').read_text().splitlines()] == [1, 2]

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
    r = warm.run([sys.executable, '-c', child, 'train', '--out', str(out), *SMOKE, 'steps=4'], cwd=ROOT, env=ENV,
                 capture_output=True, text=True, timeout=600)
    refused(r, 'cannot write checkpoint', 'No space left on device')
    assert not list((out/'checkpoints').glob('.tmp-*'))
    assert [c.name for c in (out/'checkpoints').glob('ckpt-*')] == ['ckpt-000001']

def test_success_says_where_the_results_are(run):
    r = flowgrpo('train', '--out', run, '--resume', *SMOKE, 'steps=3')  # nothing left to do: still one line
    assert r.returncode == 0 and f'results in {run}' in r.stdout.splitlines()[-1] and 'no evaluation' in r.stdout


# -- one writer per folder

# the child of the lock test: `flowgrpo train` that waits before its step 2 until the file argv[1] exists
GATED = ("import pathlib, sys, time, flowgrpo_nb.train as t, flowgrpo_nb.cli as cli\n"
         "step = t.GRPOTrainer.train_step\n"
         "def gated(self):\n"
         "    while self.step == 2 and not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\n"
         "    return step(self)\n"
         "t.GRPOTrainer.train_step = gated\n"
         "sys.exit(cli.main(sys.argv[2:]))")

def test_one_trainer_per_folder_and_a_killed_ones_lock_is_taken_over(tmp_path):
    """Two trainers on one folder: a new run (another lr) and a --resume are refused at once, naming the first's PID;
    the first, killed by SIGKILL, leaves its lock file, which --resume takes over; the folder holds one run, each step
    once."""
    out = tmp_path/'r'
    first = warm.Popen([sys.executable, '-c', GATED, str(tmp_path/'gate'), 'train', '--out', str(out), *SMOKE,
                        'steps=4'], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    t0 = time.time()
    while not (out/'checkpoints'/'ckpt-000002').exists():  # it holds the folder, waiting before step 2
        assert first.poll() is None and time.time() - t0 < 300, first.stderr.read()[-3000:]
        time.sleep(0.05)
    with ThreadPoolExecutor(2) as ex:
        rivals = list(ex.map(lambda a: flowgrpo('train', '--out', out, *a),
                             [[*SMOKE, 'steps=4', 'lr=0.001'], ['--resume', *SMOKE, 'steps=4']]))
    for r in rivals: refused(r, f'{out} is being written by another process (a trainer, PID {first.pid}, since ')
    first.kill(); first.wait(); first.stderr.close()
    assert json.loads((out/LOCK_FILE).read_text())['pid'] == first.pid  # the kernel dropped the lock; its file stays
    r = flowgrpo('train', '--out', out, '--resume', *SMOKE, 'steps=4')
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f'(a trainer, PID {first.pid}) ended without letting go of it (killed, or stopped by an error such as a '
            'full disk); taking it over') in r.stderr
    run = RunFolder(out)
    assert ([m['step'] for m in run.metrics()] == [1, 2, 3, 4]
            and run.config()['lr'] == preset_config('flow_grpo+smoke').lr)
    assert not (out/LOCK_FILE).exists()


# -- the user's own code: every failure one line, exit 2

USER_REWARDS = """import torch
def returns_str(): return lambda images, prompts: 'high'
def returns_none(): return lambda images, prompts: None
def forty_two(): return 42
def nan_on_eval():  # NaN on the evaluation's batch (6 images), finite on training batches (8)
    return lambda images, prompts: torch.full((len(prompts),), float('nan') if len(prompts) == 6 else 0.5)
"""
PROMPTS = 'a red circle\ntwo blue squares\na green cross\nthree yellow triangles\n'

@pytest.fixture
def user(tmp_path, monkeypatch):
    "A folder with the user's reward module (importable) and a prompt file in the grid world's words."
    (tmp_path/'user_rewards.py').write_text(USER_REWARDS); (tmp_path/'prompts.txt').write_text(PROMPTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path

def train_here(capsys, out, *args) -> tuple[int, str]:
    """`flowgrpo train` in this process: its exit status and its one error line (asserting there is exactly one, without
    traceback)."""
    status = cli.main(['train', '--out', str(out), '--preset', 'flow_grpo+smoke', '--quiet', *map(str, args)])
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith('flowgrpo train: ')
             and not l.startswith('flowgrpo train: warning:')]
    assert 'Traceback' not in err and len(lines) == 1, err[-3000:]
    return status, lines[0]

def test_reward_factory_that_raises_exits_2_with_one_line(user):
    r = flowgrpo('train', '--out', user/'r', *SMOKE, '--reward', 'py:json:dumps', '--prompts', user/'prompts.txt')
    refused(r, "reward 'py:json:dumps': json.dumps() raised TypeError (dumps() missing 1 required positional argument: "
               "'obj'); expected it to return a callable reward(images [B, 3, H, W] in [0, 1], prompts) -> Tensor[B]")

@pytest.mark.parametrize('fn,words', [
    ('returns_str', "step 0: reward 'py:user_rewards:returns_str': reward(images [8, 3, 32, 32], 8 prompts) "
                    "returned a str ('high'); expected a Tensor[8] of real numbers, one score per image"),
    ('returns_none', "reward(images [8, 3, 32, 32], 8 prompts) returned None; expected a Tensor[8] of real numbers"),
    ('forty_two', "reward 'py:user_rewards:forty_two': user_rewards.forty_two() returned an int (42); "
                  "expected a callable reward(images")])
def test_reward_that_returns_the_wrong_thing_exits_2_with_one_line(user, capsys, fn, words):
    status, line = train_here(capsys, user/'r', '--reward', f'py:user_rewards:{fn}', '--prompts', user/'prompts.txt',
                              '--set', 'log_with=none', 'eval_images=0')
    assert status == 2 and words in line, line

def test_nan_in_an_evaluation_stops_the_run_and_records_no_nan(user, capsys):
    out = user/'r'
    status, line = train_here(capsys, out, '--reward', 'py:user_rewards:nan_on_eval', '--prompts', user/'prompts.txt',
                              '--set', 'log_with=none', 'eval_images=6', 'save_every=1', 'steps=3', '--no-base-eval')
    assert status == 2 and line.startswith("flowgrpo train: evaluation at step 3: the evaluation reward "
                                           "'py:user_rewards:nan_on_eval' is nan for sample 0 "
                                           "(prompt 'a red circle')"), line
    assert 'checkpoints up to ckpt-000002 are kept' in line
    run = RunFolder(out)
    assert (run.summary() is None and [m['step'] for m in run.metrics()] == [1, 2]
            and 'NaN' not in run.file('metrics').read_text())
    assert not (out/LOCK_FILE).exists()

def test_prompt_files_are_checked_before_any_model_loads(user, capsys, monkeypatch):
    def no_model(*a, **k): raise AssertionError('a model was loaded')
    monkeypatch.setattr('flowgrpo_nb.train.load_policy', no_model)
    gz = user/'prompts.txt.gz'; gz.write_bytes(b'\x1f\x8b\x08\x00' + bytes(range(256)))
    status, line = train_here(capsys, user/'r', '--reward', 'py:user_rewards:returns_str', '--prompts', gz)
    assert status == 2 and line == (f"flowgrpo train: prompt file {gz}, line 1: byte 0x8b is not UTF-8; "
                                    "expected a UTF-8 text file (one prompt per line, or JSONL)")
    long = user/'long.txt'; long.write_text('a red circle\n' + 'a red circle and ' * 600 + '\n')
    status, line = train_here(capsys, user/'r', '--reward', 'py:user_rewards:returns_str', '--prompts', long)
    assert status == 2 and line == (f"flowgrpo train: prompt file {long}, line 2: a prompt of 10199 characters; "
                                    "at most 2000 are allowed")
    # 9 words: the tiny model reads 8
    words = user/'words.txt'; words.write_text('a red circle left of a blue square today\n')
    status, line = train_here(capsys, user/'r', '--reward', 'py:user_rewards:returns_str', '--prompts', words)
    assert status == 2 and line.endswith('words.txt, line 1: a prompt of 9 words; the model reads at most 8')
    assert not (user/'r').exists()  # nothing left that blocks the next try

def test_a_negative_seed_is_refused_before_anything_loads(capsys, tmp_path):
    "The seed is checked with the config, before the model loads or any folder is made: one sentence naming it."
    out = tmp_path/'r'
    status, line = train_here(capsys, out, '--set', 'seed=-1')
    assert status == 2 and line == 'flowgrpo train: GRPOConfig.seed=-1: allowed an integer >= 0', line
    assert not out.exists()
