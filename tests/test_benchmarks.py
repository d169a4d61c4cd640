"The benchmark scripts run end to end at their smallest sizes and print what their docstrings promise (not timings)."
import json, math, re, subprocess, sys
import pytest
from pathlib import Path
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parents[1]

def bench(name:str, *args:str, timeout:int=600) -> str:
    res = warm.run([sys.executable, str(ROOT/'benchmarks'/name), *args], capture_output=True, text=True,
                   timeout=timeout,
                   env={'OMP_NUM_THREADS': '1', 'PATH': '/usr/bin:/bin', 'HOME': str(Path.home())})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout

def test_network_eager_vs_fast():
    out = bench('network.py', '--forward', '4', '--update', '4', '--threads', '1', '--reps', '2')
    peaks = re.search(r'matmul peak fp32 (\d+) GFLOP/s, bf16 (\d+) GFLOP/s', out)
    assert peaks, out  # the peaks are measured and printed; how fast this CPU is, is not a test's business
    for kind in ('forward', r'fwd\+bwd'):  # each size: an eager row, then a fast row with the paired speed-up
        assert re.search(rf'\n\s+1\s+4\s+{kind}\s+eager\s+[\d.]+ \([\d.]+-[\d.]+\)\s+\d+\s+[\d.]+\s+\d+%\s*\n'
                         rf'\s+1\s+4\s+{kind}\s+fast\s+[\d.]+ \([\d.]+-[\d.]+\)\s+\d+\s+[\d.]+\s+\d+%\s+[\d.]+x',
                         out), (kind, out)
    m = re.search(r"linear layers alone: [\d.]+ ms for [\d.]+ GFLOP \((\d+)% of the forward's FLOPs\) "
                  r"= ([\d.]+) GFLOP/s, (\d+)% of", out)
    # the linears are nearly all of the FLOPs: the bound means something
    assert m and 90 <= int(m.group(1)) <= 100 and float(m.group(2)) > 0, out
    for kind in ('matmul', 'gelu', 'attention'): assert re.search(rf'\n\s+{kind}\s+[\d.]+%', out), kind

def test_profile_json(tmp_path):
    js = tmp_path/'p.json'
    out = bench('phases.py', '--budget', 'smoke', '--steps', '1', '--threads', '1', '--methods', 'flow_grpo,dense',
                '--json', str(js))
    d = json.loads(js.read_text())
    assert set(d['methods']) == {'flow_grpo', 'dense'} and d['peak_gflops']['1']['best'] > 0
    ph = d['methods']['dense']['phases']
    assert {'rollout', 'values', 'update', 'evaluation', 'calibration'} <= set(ph)
    assert ph['values']['nfe'] > 0 and d['methods']['flow_grpo']['phases'].get('values', {}).get('nfe', 0) == 0
    assert all(0 <= p['peak_fraction'] < 2 for p in ph.values())
    assert 'phase' in out and '% peak' in out

def test_job_ab_modes(tmp_path):
    # one thread in the old way too: on a busy machine its two threads spin (about 5x the CPU seconds of one)
    out = bench('job_ab.py', '--budget', 'smoke', '--arms', 'flow_grpo,dense', '--steps', '1', '--prompts', '2',
                '--group', '4', '--reps', '1', '--threads', '1')
    before = re.search(r'rep 0 before .*held-out \(skipped\) flow_grpo [\d.]+ \((\d+)%\) dense [\d.]+ \((\d+)%\)', out)
    now = re.search(r'rep 0 now .*held-out \(skipped\) flow_grpo [\d.]+ \((\d+)%\) dense [\d.]+ \((\d+)%\)', out)
    assert before and now, out
    assert before.groups() == ('0', '0')  # the old way evaluates every pair
    assert re.search(r'wall: before / now = [\d.]+x', out) and re.search(r'cpu: before / now = [\d.]+x', out)

def test_job_ab_bad_arm():
    res = warm.run([sys.executable, str(ROOT/'benchmarks'/'job_ab.py'), '--arms', 'flow_grpo,nope'],
                   capture_output=True, text=True)
    assert res.returncode != 0 and "arms='flow_grpo,nope'" in res.stderr and 'Traceback' not in res.stderr

def test_precision_table():
    out = bench('precision.py', '--budget', 'smoke', '--methods', 'flow_grpo,dense', '--steps', '1', '--warmup', '0',
                '--reps', '1')
    assert re.search(r'flow_grpo\s+fp32/bf16\s+[\d.]+×', out), out
    assert re.search(r'dense\s+values of one rollout \(ode:rest\): \d+/\d+ equal in fp32 and bf16', out), out

@pytest.mark.chrome
def test_png_export_under_load():
    out = bench('png_export.py', '--calls', '2', '--figures', '2', '--at-once', '2', '--timeout', '120')
    m = re.search(r'4 PNGs tried in 2 calls, 2 at a time, on \d+ CPUs \(load average before the end: [\d.]+\): (\d+) '
                  r'written; (\d+) hung \(stopped at 120 s\), (\d+) other warnings or failures; a call took median '
                  r'[\d.]+ s, worst [\d.]+ s; \d+ s in all', out)
    assert m and m.groups() == ('4', '0', '0'), out
    assert 'left behind: nothing' in out, out

def test_pilot_metrics_at_the_horizon():
    """The pilot's candidate metrics read a run's curve cut at the confirmatory horizon, with the package's own
    definitions."""
    sys.path.insert(0, str(ROOT/'benchmarks'))
    import pilot
    run = dict(curve=[[0, 0.2], [25, 0.3], [50, 0.4], [75, 0.3], [100, 0.5], [125, 0.9]])
    v = pilot.metric_values(run, horizon=100)
    assert v['final'] == 0.5 and v['last_mean2'] == pytest.approx(0.4) and v['last_mean3'] == pytest.approx(0.4)
    assert v['auc'] == pytest.approx((0.25 + 0.35 + 0.35 + 0.4) * 25 / 100) and v['gain'] == pytest.approx(0.3)
    assert pilot.metric_values(dict(curve=[[0, 0.2], [25, 0.3]]), horizon=100) == {}, \
        'a run that stopped before H has none'
    sds = pilot.metric_sds([run, dict(curve=[[s, y + 0.1] for s, y in run['curve']])], horizon=100)
    assert sds['final']['sd'] == pytest.approx(0.1 / 2 ** 0.5) and sds['gain']['sd'] == pytest.approx(0.0, abs=1e-12)
    assert sds['final']['sd_paired'] == pytest.approx(0.0, abs=1e-12), \
        "a shift of the whole curve (the seed's evaluation) cancels in a pair"
    other = dict(curve=[[s, y + (0.1 if s == 100 else 0)] for s, y in run['curve']])
    assert pilot.metric_sds([run, other], horizon=100)['final']['sd_paired'] == pytest.approx(0.1)

def test_pilot_screening_rule():
    """The screen's choice: no collapse on its screening seeds, then the highest mean final score; confirmation seeds do
    not count."""
    sys.path.insert(0, str(ROOT/'benchmarks'))
    import pilot
    run = lambda seed, final, collapse=None, cpu=1.0: dict(seed=seed, final=final, collapse=collapse, cpu_per_step=cpu)
    s0, s1 = pilot.SCREEN_SEEDS
    runs = dict(a=[run(s0, 0.30), run(s1, 0.32)], b=[run(s0, 0.40), run(s1, 0.45, collapse=dict(step=200))],
                c=[run(s0, 0.32), run(s1, 0.32), run(1007, 0.0)], d=[run(s0, 0.50)])
    assert pilot.screen_choice(runs) == 'c', \
        'b collapsed, d is not screened on every seed, c beats a; a later seed does not count'
    assert pilot.screen_choice(dict(a=runs['a'], e=[run(s0, 0.30, cpu=0.5), run(s1, 0.32, cpu=0.5)])) == 'e', \
        'a tie: the cheaper'
    assert pilot.screen_choice(dict(b=runs['b'])) is None

def test_prereg_plan_from_a_pilot_table(tmp_path):
    "The pre-registration's planning SDs and level metric come from the pilot table; seeds are sized at the Holm level."
    sys.path.insert(0, str(ROOT/'benchmarks'))
    import prereg
    from flowgrpo_nb.study.design import seeds_for, holm_level
    ms = lambda final, lm2: dict(final=dict(sd=.02, sd_paired=final, n=8), last_mean2=dict(sd=.02, sd_paired=lm2, n=8),
                                 auc=dict(sd=.02, sd_paired=.012, n=8))
    pilot = tmp_path/'pilot.json'
    pilot.write_text(json.dumps(dict(candidates=dict(safe=dict(metrics_at_H=ms(.03, .02))))))
    rows = prereg.plan('safe', pilot)
    d1, d1v = (next(r for r in rows if r['id'] == i) for i in ('D1', 'D1v'))
    assert (d1['metric'], d1['k'], d1['sd']) == ('last_mean', 2, .02), 'the mean of the last two is steadier here'
    assert (d1v['metric'], d1v['sd']) == ('auc', .012)
    d3 = next(r for r in rows if r['id'] == 'D3')
    assert d3['task'] == 'score' and 'exploratory study' in d3['sd_from'] and d3['sd'] > 0
    text = prereg.toml_text(rows, dict(geneval=[2000, 2001], score=[3000, 3001]), 'safe')
    (tmp_path/'p.toml').write_text(text)
    from flowgrpo_nb.study.design import load_prereg, prereg_seeds
    plan = prereg_seeds(load_prereg(tmp_path/'p.toml'))
    m = sum(r.get('family', 'primary') == 'primary' for r in prereg.CLAIMS)
    assert plan['m'] == m and plan['level'] == holm_level(0.05, m)
    assert next(r for r in plan['rows'] if r['id'] == 'D1')['seeds'] == \
        seeds_for('superiority', .02, prereg.LEVEL, holm_level(0.05, m))
    with pytest.raises(SystemExit, match='not in'): prereg.plan('fast', pilot)

def test_prereg_fits_the_study_to_its_budget():
    """The budget rule: the primary claim asking most seeds moves to the secondary family until the primary arms x seeds
    fit; secondary claims join in order (moved ones last) while the total fits; hand-checked on unit costs."""
    sys.path.insert(0, str(ROOT/'benchmarks'))
    import prereg
    from flowgrpo_nb.study.design import seeds_for, holm_level
    row = lambda id, arm, other, sd, task='geneval', family='primary': dict(
        id=id, question='?', arm=arm, other=other, claim='level', task=task, test='superiority', family=family,
        metric='final', margin=.02, sd=sd)
    rows = [row('A', 'dense', 'flow_grpo', .02), row('B', 'stepwise', 'flow_grpo', .02),
            row('C', 'dense', 'dense_nocal', .2, 'score'),
            row('X', 'turning_point', 'dense_nocal', .02, family='secondary'),
            row('Y', 'flow_grpo_ddim', 'stepwise', .02, family='secondary')]
    cost = lambda task, arms: 3600.0 * len(arms)  # one CPU-hour per arm and seed
    n2 = seeds_for('superiority', .02, .02, holm_level(0.05, 2))   # A and B once C has moved
    kept, seeds, out = prereg.fit_budget(rows, hours=3 * n2 + 1 * n2, cost=cost, secondary_seeds=2)
    c = next(r for r in kept + out if r['id'] == 'C')
    assert c['family'] == 'secondary' and 'asks' in c['note'], 'C asks the most seeds: moved'
    assert seeds == {'geneval': list(range(2000, 2000 + n2))}, 'the primary family sized at alpha / 2'
    assert [r['id'] for r in kept] == ['A', 'B', 'Y'] and [r['id'] for r in out] == ['X', 'C'], \
        'X needs two more arms, Y one'


# ---- SD3.5 Medium at its real size: the CPU run's JSON, the GPU model and the README written from them

def _load(name:str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name.removesuffix('.py'), ROOT/'benchmarks'/name)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m

def test_sd35_readme_is_written_from_the_json():
    """benchmarks/README.md is exactly what sd35_tables.py writes from results/sd35_real/*.json: no number is typed by
    hand."""
    tables = _load('sd35_tables.py')
    assert (ROOT/'benchmarks'/'README.md').read_text() == tables.render(), 'run python benchmarks/sd35_tables.py'

def test_sd35_model_follows_from_its_counts():
    """The committed GPU model is what sd35_model.model gives from the committed counts (the counts take minutes: not
    redone here)."""
    model, d = _load('sd35_model.py'), json.loads((ROOT/'results'/'sd35_real'/'gpu_model.json').read_text())
    m = d['model']
    assert 'not a measurement' in d['note']
    again = json.loads(json.dumps(model.model(d['counts'], m['K'], m['G'], m['P'], tuple(m['mfu']),
                                              m['gpu']['peak_tflops'], m['gpu']['memory_gb'])))
    assert again == m

def test_sd35_cpu_run_is_complete_and_finite():
    """The committed CPU run at SD3.5 Medium's real config: every operator and every method's step ran, with finite loss
    and gradient."""
    d = json.loads((ROOT/'results'/'sd35_real'/'cpu.json').read_text())
    c = d['config']
    assert (c['layers'] == 24 and c['transformer_params'] > 2.2e9 and c['dual_attention_layers'] == list(range(13))
            and c['qk_norm'] == 'rms_norm')
    assert set(d['lookahead']) == {'tweedie', 'ode:2', 'ode:rest'} and all(v['finite'] for v in d['lookahead'].values())
    assert set(d['train']) == {'flow_grpo', 'stepwise', 'dense', 'turning_point'}
    for name, t in d['train'].items():
        x = t['metrics']
        assert all(math.isfinite(x[k]) for k in ('loss', 'grad_norm', 'update_norm')) and x['grad_norm'] > 0, name
        assert (t['recipe']['ema'] and t['recipe']['updates_per_rollout'] == 2
                and t['recipe']['gradient_checkpointing']), name

def test_cpu_real_bad_input_is_one_sentence():
    res = warm.run([sys.executable, str(ROOT/'benchmarks'/'gpu_bench.py'), '--cpu-real', '--group', '1'],
                   capture_output=True, text=True)
    assert res.returncode == 2 and 'GRPO needs groups of >= 2 samples' in res.stderr and 'Traceback' not in res.stderr

def test_cpu_real_runs_at_its_smallest(tmp_path):
    """`gpu_bench.py --cpu-real` end to end at 2 blocks of SD3.5 Medium's width, 32 px, K = 2: the JSON the README is
    written from."""
    out = bench('gpu_bench.py', '--cpu-real', '--layers', '2', '--resolution', '32', '--K', '2', '--methods',
                'flow_grpo', 'dense', '--ops', 'tweedie', 'ode:rest', '--threads', '1', '--out',
                str(tmp_path/'cpu.json'))
    d = json.loads((tmp_path/'cpu.json').read_text())
    assert (d['machine']['cpu_capability'] and d['matmul_probe']['chosen'] in ('bf16', 'fp32')
            and d['config']['dtype'] == d['matmul_probe']['chosen'])
    assert (d['config']['dual_attention_layers'] == [0] and d['rollout']['nfe'] == 4
            and d['lookahead']['ode:rest']['nfe'] > 0)
    for name in ('flow_grpo', 'dense'):
        t = d['train'][name]
        assert math.isfinite(t['metrics']['loss']) and t['metrics']['grad_norm'] > 0 and t['peak_rss_gib'] > 0, name
    assert 'train dense:' in out
    md = _load('sd35_tables.py').render(cpu=d)  # the README generator reads a partial run too
    assert '| dense | ode:rest |' in md and '| stepwise |' not in md.split('## One H200')[0]

def test_value_cost_table(tmp_path):
    "value_cost.py prices a latent-valued rule beside Flow-GRPO's: Flow-GRPO's generator NFE, the value's apart."
    js = tmp_path/'cost.json'
    out = bench('value_cost.py', '--steps', '1', '--warmup', '0', '--methods', 'flow_grpo,dense_latent',
                '--out', str(js))
    d = json.loads(js.read_text())['methods']
    assert d['dense_latent']['nfe_generator'] == d['flow_grpo']['nfe_generator'] == 10
    assert d['dense_latent']['loss_finite']
    assert d['dense_latent']['nfe_value'] > 0 == d['flow_grpo']['nfe_value'] and 'dense_latent' in out
