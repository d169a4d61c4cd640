"""A newcomer's first commands say what they are doing before the work and move a bar over training steps: the main
job (`flowgrpo compare`, here on a tiny budget), one training run (`flowgrpo train --preset tempflow`) and a
credit-fidelity measurement (`flowgrpo fidelity`, its bar over the generator's evaluations). Each test reads the
command's output as it comes and stops the command once its bar has moved."""
import os, re, select, signal, subprocess, sys, time

import pytest
import warm  # python commands in a warm interpreter (tests/warm.py)


def stream(args:list, done, limit:float=600) -> list[str]:
    """The lines (split at carriage returns too: a bar redraws its line) that `flowgrpo *args` writes on stdout and
    stderr, until `done(lines)` holds or it ends; then it is stopped (SIGTERM) and waited for."""
    p = warm.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', *args], stdout=subprocess.PIPE,
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


def test_fidelity_says_its_plan_then_moves_a_bar_to_what_it_measured(tmp_path):
    """`flowgrpo fidelity` prints what it measures with an estimate, then a bar over the generator's evaluations that
    ends at the NFE its result records (the plan is exact)."""
    import json
    out = tmp_path/'fid'
    lines = stream(['fidelity', '--prompts', '2', '--batch-prompts', '1', '--group', '2', '-k', '4', '-m', '2',
                    '--n-boot', '20', '--arms', 'flow_grpo,dense', '--no-png', '--out', str(out)],
                   lambda ls: any(l.startswith('wrote ') for l in ls))
    n = json.loads((out/'fidelity.json').read_text())['base']['cost']['total']['nfe']
    plan = first(lines, rf'^measuring 2 arm\(s\) \(1 sampler\(s\)\) on 1 model\(s\): 2 prompts x 2 samples, M=2 '
                        rf'continuations; {n:,} NFE, estimated \d+ s of CPU on this machine$')
    assert plan < first(lines, rf'fidelity:\s+0%.*\b0/{n}\b') < first(lines, rf'fidelity:\s+100%.*\b{n}/{n}\b') \
        < first(lines, r'^base: ') < first(lines, r'^wrote ')


def test_the_fidelity_bar_moves_inside_a_batch():
    "The bar is redrawn from the policy's NFE counter while the measurement runs, not only between batches."
    from flowgrpo_nb.policy import NFECounter
    from flowgrpo_nb.study.fidelity import FidelityConfig
    from flowgrpo_nb.study.fidelity_plan import nfe_bar
    class Policy: nfe = NFECounter()
    Policy.nfe.add(7)  # counted before: not this measurement's
    with nfe_bar(Policy, dict(what='1 arm(s)', nfe=100, seconds=2.0), FidelityConfig(), every=0.01) as bar:
        Policy.nfe.add(40)
        t0 = time.monotonic()
        while bar.n != 40 and time.monotonic() - t0 < 30: time.sleep(0.01)
        assert bar.n == 40, bar.n
        Policy.nfe.add(60)
    assert bar.n == 100
