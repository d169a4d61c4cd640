"""The app (flowgrpo_nb.app): handlers in-process, the launched app through gradio_client, and a real browser.

A fake compare folder (two runs with random LoRA checkpoints, `app.fake_runs`) stands in for `flowgrpo compare`."""
import json, os, socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import pytest, torch

os.environ.setdefault('GRADIO_ANALYTICS_ENABLED', 'False')
from flowgrpo_nb.app import ModelBank, fake_runs, find_models, generate_all, make_app, report_view, check_settings

CHROMIUM = Path('/usr/bin/chromium')
ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking']
STEPS = 4  # small: the CPUs are shared

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    out = fake_runs(tmp_path_factory.mktemp('runs')/'compare', methods=('flow_grpo', 'dense', 'turning_point'))
    (out/'seed0'/'stepwise'/'checkpoints').mkdir(parents=True)  # started, nothing saved yet
    (out/'seed0'/'stepwise'/'config.json').write_text('{}')
    return out

@pytest.fixture(scope='module')
def bank(runs): return ModelBank(runs)

@pytest.fixture(scope='module')
def app(bank): return make_app(bank=bank)

def handler(app, api_name):
    return next(f.fn for f in app.fns.values() if f.api_name == api_name)

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

@pytest.fixture(scope='module')
def served(app):
    port = free_port()
    app.queue(default_concurrency_limit=1).launch(server_name='127.0.0.1', server_port=port, prevent_thread_lock=True,
                                                  quiet=True)
    yield f'http://127.0.0.1:{port}/'
    app.close()

# --- in-process ---

def test_models_found(bank):
    assert bank.names == ['base', 'seed0/dense', 'seed0/flow_grpo', 'seed0/turning_point']
    assert bank.skipped == ['seed0/stepwise: no checkpoint yet']
    assert len(bank.policies) == 1, 'runs of one LoRA shape share one network'

def test_every_event_has_api_name(app):
    names = [f.api_name for f in app.fns.values()]
    assert all(names) and {'generate', 'report', 'credit', 'example'} <= set(names)

def test_generate_handler(app, bank):
    msg, images, table, strips = handler(app, 'generate')('a red circle', 3, STEPS, 4.0, 'ode')
    assert len(images) == len(strips.data) == len(bank.names), msg
    assert all(img.shape == (192, 192, 3) for img, _ in images)
    for name in bank.names: assert f'| {name} |' in table
    assert 'colors' in table and 'found: ' in images[0][1]
    assert strips.layout.xaxis.ticktext[-1].startswith(f'k={STEPS}<br>V=')

def test_same_noise_different_models(bank):
    a = generate_all(bank, 'a square', seed=5, steps=STEPS)
    b = generate_all(bank, 'a square', seed=5, steps=STEPS, models=['seed0/dense', 'base'])
    assert torch.equal(a[0].image, b[1].image) and torch.equal(a[1].image, b[0].image)
    assert not torch.equal(a[0].image, a[1].image), 'an adapter changes the image'
    for s in a: assert s.previews.shape == (STEPS + 1, 3, 32, 32) and len(s.values) == STEPS + 1

def test_sde_samplers(bank):
    for sampler in ('flow_sde', 'cps', 'ddim'):
        s = generate_all(bank, 'two circles', seed=0, steps=3, sampler=sampler, models=['base'])[0]
        assert 0 <= s.partial <= 1 and s.category == 'counting'

@pytest.mark.parametrize('prompt,steps,says', [
    ('a purple circle', STEPS, "unknown words ['purple']"),
    ('', STEPS, 'prompt is empty'),
    ('a' * 10_000, STEPS, '10000 characters'),
    ('a circle', 0, 'steps=0: allowed an integer in [1, 100]'),
    ('a circle', 101, 'steps=101'),
    ('a circle', None, 'steps=None'),
    ('circle a and', STEPS, 'grammar'),
])
def test_bad_input_is_a_message(app, prompt, steps, says):
    msg, images, table, strips = handler(app, 'generate')(prompt, 0, steps, 4.0, 'ode')
    assert 'Invalid input' in msg and says in msg, msg
    assert images == [] and strips is None

def test_runs_without_checkpoints(runs):
    bank = ModelBank(runs/'seed0'/'stepwise')
    assert bank.names == ['base'] and 'No fine-tuned checkpoints' in bank.message()
    app = make_app(bank=bank)
    msg, images, *_ = handler(app, 'generate')('a circle', 0, 2, 4.0, 'ode')
    assert len(images) == 1, msg
    with pytest.raises(ValueError, match='not a folder'): find_models(runs/'missing')

def test_credit_handler(app):
    msg, gain, preview, rows = handler(app, 'credit')('a circle and a square', 'seed0/dense', 0, STEPS, 4.0, 'flow_sde')
    assert gain is not None and preview is not None, msg
    assert {'advantages: dense', 'advantages: turning_point'} <= {a.text for a in gain.layout.annotations}
    msg, gain, *_ = handler(app, 'credit')('a circle', 'base', 0, 1, 4.0, 'flow_sde')
    assert gain is None and 'at least 2 steps' in msg

def test_report(app, runs, tmp_path):
    md, figs = report_view(runs)
    assert 'No `report.json`' in md and figs == [None] * 4
    cats = dict(strict=0.5, se=0.1)
    report = dict(base=dict(overall=dict(strict=0.3, se=0.02), single_object=cats),
                  methods=dict(flow_grpo=dict(per_category=dict(single_object=dict(mean=0.6, se=0.1)),
                                              seconds_per_step={p: dict(mean=1.0) for p in ('rollout', 'values', 'credit', 'update')},
                                              nfe_per_sample=dict(rollout=10, lookahead=0))),
                  per_seed={'0': dict(flow_grpo=dict(curve=[dict(step=0, seconds=0, eval=0.3, se=0.02)]))},
                  findings=['dense reaches Flow-GRPO sooner'])
    (tmp_path/'report.json').write_text(json.dumps(report))
    md, figs = report_view(tmp_path)
    assert 'dense reaches' in md and all(f is not None for f in figs)
    (tmp_path/'report.json').write_text('{not json')
    md, figs = report_view(tmp_path)
    assert 'cannot be read' in md and figs == [None] * 4

def test_check_settings():
    assert check_settings(1, 10.0, 4, 'cps') == (1, 10, 4.0, 'cps', 0.7)
    with pytest.raises(ValueError, match='guidance'): check_settings(0, 10, float('nan'), 'ode')

# --- launched ---

def test_client(served, bank):
    from gradio_client import Client
    c = Client(served, verbose=False)
    msg, images, table, strips = c.predict('a blue square', 0, STEPS, 4.0, 'ode', api_name='/generate')
    assert len(images) == len(bank.names), msg
    assert all(Path(im['image']).exists() for im in images)
    msg, images, *_ = c.predict('a purple square', 0, STEPS, 4.0, 'ode', api_name='/generate')
    assert 'purple' in msg and images == []
    msg, *_ = c.predict('a square', 0, 500, 4.0, 'ode', api_name='/generate')
    assert 'steps=500' in msg
    jobs = [c.submit(p, i, 2, 4.0, 'ode', api_name='/generate') for i, p in enumerate(['a circle', 'a cross', 'three squares'])]
    assert [len(j.result(timeout=300)[1]) for j in jobs] == [len(bank.names)] * 3, 'the app keeps serving'

# --- a real browser ---

@pytest.mark.chrome
def test_browser_generate(served, bank, tmp_path):
    if not CHROMIUM.exists(): pytest.skip('needs Debian chromium at /usr/bin/chromium')
    pw = pytest.importorskip('playwright.sync_api')
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport=dict(width=1300, height=900))
        page.goto(served, wait_until='load')
        box = page.locator('#prompt textarea')
        box.wait_for(timeout=60_000)
        box.fill('a purple circle')
        page.locator('#generate').click()
        page.get_by_text("unknown words ['purple']").wait_for(timeout=120_000)
        box.fill('a green triangle')
        page.locator('#generate').click()
        n = len(bank.names)
        page.wait_for_function(f'document.querySelectorAll("#images img").length >= {n}', timeout=180_000)
        imgs = page.locator('#images img').count()
        page.screenshot(path=str(tmp_path/'app.png'), full_page=True)
        browser.close()
    assert imgs == n, (imgs, n)

def test_cli_flags():
    from fastcore.script import anno_parser
    from flowgrpo_nb.app import app_cli
    a = anno_parser(app_cli).parse_args(['--runs', 'runs/compare', '--port', '7861'])
    assert (a.runs, a.host, a.port, a.threads, a.share) == ('runs/compare', '127.0.0.1', 7861, 1, False)
