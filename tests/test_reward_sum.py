"""A sum of rewards on the embedded default: each component's curve in the log, and GDPO's mode trains (issue 63 item
3); the per-component advantages against a hand example are in 05_credit and 06_collect."""
import json, math, os, subprocess, sys
from pathlib import Path
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}

def test_gdpo_trains_the_embedded_default_with_each_component_logged(tmp_path):
    out = tmp_path/'gdpo'
    r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), '--preset',
                  'flow_grpo+smoke', '--quiet', '--reward', 'partial+score', '--set', 'steps=2', 'eval_images=8',
                  'log_with=none', 'reward_norm=gdpo'], cwd=ROOT, env=ENV, capture_output=True, text=True,
                 timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out/'config.json').read_text())['reward_norm'] == 'gdpo'
    recs = [json.loads(l) for l in (out/'metrics.jsonl').read_text().splitlines() if l.strip()]
    steps = [x for x in recs if 'reward[partial]' in x]
    assert len(steps) == 2
    for x in steps:
        assert math.isclose(x['reward'], x['reward[partial]'] + x['reward[score]'], rel_tol=1e-5, abs_tol=1e-6)
        assert x['adv_abs'] > 0 and math.isfinite(x['loss'])

def test_gdpo_on_one_reward_is_one_sentence(tmp_path):
    r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(tmp_path/'x'), '--preset',
                  'flow_grpo+smoke', '--quiet', '--set', 'reward_norm=gdpo'], cwd=ROOT, env=ENV,
                 capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert "reward_norm='gdpo'" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path/'x').exists()
