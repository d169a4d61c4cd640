"""A newcomer's first commands say what they are doing before the work and move a bar over training steps: the main
job (`flowgrpo compare`, here on a tiny budget) and one training run (`flowgrpo train --preset tempflow`). Each test
reads the command's output as it comes and stops the command once its step bar has moved."""
import os, re, select, signal, subprocess, sys, time

import pytest


def stream(args:list, done, limit:float=600) -> list[str]:
    """The lines (split at carriage returns too: a bar redraws its line) that `flowgrpo *args` writes on stdout and
    stderr, until `done(lines)` holds or it ends; then it is stopped (SIGTERM) and waited for."""
    p = subprocess.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, 'OMP_NUM_THREADS': '1'})
    text, t0 = b'', time.monotonic()
    try:
        while time.monotonic() - t0 < limit:
            if select.select([p.stdout], [], [], 1.0)[0]:
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk: break
                text += chunk
                if done(re.split(r'[\r\n]', text.decode(errors='replace'))): break
            elif p.poll() is not None: break
    finally:
        if p.poll() is None: os.killpg(p.pid, signal.SIGTERM)
        p.wait(120); p.stdout.close()
    return [l.strip() for l in re.split(r'[\r\n]', text.decode(errors='replace')) if l.strip()]


def first(lines:list, pattern:str) -> int:
    "Index of the first line matching `pattern` (a failure names the lines read)."
    i = next((i for i, l in enumerate(lines) if re.search(pattern, l)), None)
    assert i is not None, f'no line matches {pattern!r} in:\n' + '\n'.join(lines[-40:])
    return i


def test_compare_says_its_plan_then_moves_a_step_bar(tmp_path):
    moved = r'training steps:\s+\d+%.*\b[1-9]\d*/4\b'
    lines = stream(['compare', '--budget', 'smoke', '--tasks', 'geneval', '--arms', 'flow_grpo', 'dense',
                    '--set', 'steps=2', '--no-png', '--out', str(tmp_path/'cmp')],
                   lambda ls: any(re.search(moved, l) for l in ls))
    plan = first(lines, r'^1 base evaluation\(s\), then 2 run\(s\) to train \(4 steps\) on \d+ worker\(s\); '
                        r'estimated \d+ min')
    # the plan comes before any bar or result; the bar counts the 4 steps of the 2 runs
    assert plan < first(lines, r'training steps:.*0/4') < first(lines, moved)
    assert not any('finished' in l for l in lines[:plan])


def test_train_says_each_phase_then_moves_its_step_bar(tmp_path):
    moved = r'tempflow:\s+50%.*1/2'
    lines = stream(['train', '--preset', 'tempflow', '--set', 'steps=2', 'eval_images=16',
                    '--out', str(tmp_path/'run')], lambda ls: any(re.search(moved, l) for l in ls))
    order = [first(lines, p) for p in (r'^recipe tiny', r'evaluating the base model \(16 images\)',
                                       r'^training: steps 1\.\.2, \d+ prompts x 4 samples$',
                                       r'tempflow:\s+0%.*0/2', moved)]
    assert order == sorted(order), (order, lines)
