"`flowgrpo export --csv` on the kept credit study: one row per (run, step), the report's curves."
import csv, json
from pathlib import Path
import pytest
from flowgrpo_nb import cli
from flowgrpo_nb.checkpoint import RunFolder
from flowgrpo_nb.study.export import export_rows

ROOT = Path(__file__).resolve().parent.parent
CREDIT = ROOT/'results'/'credit'

@pytest.fixture(scope='module')
def table(tmp_path_factory):
    "results/credit exported by the command, read back from the CSV it wrote."
    out = tmp_path_factory.mktemp('export')/'credit.csv'
    assert cli.main(['export', str(CREDIT), '--csv', '--out', str(out)]) == 0
    return list(csv.DictReader(out.open()))

def num(x:str): return None if x == '' else float(x)

def test_one_row_per_run_and_step(table):
    report = json.loads((CREDIT/'report.json').read_text())
    runs = {(t, s, a) for t, sec in report['tasks'].items() for s, arms in sec['per_seed'].items() for a in arms}
    assert {(r['task'], r['seed'], r['arm']) for r in table} == runs
    keys = [(r['run'], int(r['step'])) for r in table]
    assert len(keys) == len(set(keys))
    for t, s, a in runs:  # the base point, then every step the run logged
        steps = [int(r['step']) for r in table if r['run'] == f'{t}/seed{s}/{a}']
        logged = len(RunFolder(CREDIT/'runs'/t/f'seed{s}'/a).metrics())
        assert steps == list(range(logged + 1))
    assert {r['cpu_kind'] for r in table} == {'AMD EPYC (AVX2)'}
    assert {r['precision'] for r in table} == {'fp32 eager'}
    assert {r['method'] for r in table} == {'flow_grpo', 'dense'}

def test_the_report_curves_come_back(table):
    "Every run's held-out curve (score, CPU seconds, NFE, wall seconds, learned score) and reward curve: report.json's."
    report = json.loads((CREDIT/'report.json').read_text())
    by = {(r['run'], int(r['step'])): r for r in table}
    n = 0
    for t, sec in report['tasks'].items():
        for s, arms in sec['per_seed'].items():
            for a, res in arms.items():
                for p in res['curve']:
                    r = by[(f'{t}/seed{s}/{a}', p['step'])]
                    assert num(r['eval_overall']) == p['eval'] and num(r['eval_overall_se']) == p['se']
                    assert num(r['nfe']) == p['nfe'] and num(r['cpu_seconds']) == pytest.approx(p['seconds'], 1e-12)
                    assert num(r['wall_seconds']) == p.get('wall') and num(r.get('eval_score', '')) == p.get('learned')
                    for c, v in (p.get('categories') or {}).items(): assert num(r[f'eval_{c}']) == v
                    n += 1
                for p in res['reward_curve']:
                    r = by[(f'{t}/seed{s}/{a}', p['step'])]
                    assert num(r['reward']) == p['reward']
                    assert num(r['cpu_seconds']) == pytest.approx(p['seconds'], 1e-12)
    assert n > 300

def test_bad_input_is_one_sentence(tmp_path, capsys):
    assert cli.main(['export', str(tmp_path/'nowhere'), '--csv']) == 2
    assert capsys.readouterr().err.strip().count('\n') == 0
    assert cli.main(['export', str(CREDIT)]) == 2
    assert '--csv' in capsys.readouterr().err
    assert export_rows(CREDIT/'runs'/'score'/'seed6000'/'dense')[0]['arm'] == 'dense'  # one run folder
