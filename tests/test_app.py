"""The app (flowgrpo_nb.app, its models from flowgrpo_nb.bank): handlers in-process, the launched app through
gradio_client, the command line, and a real browser.

A fake compare folder (three runs with random LoRA checkpoints, `app.fake_runs`) stands in for `flowgrpo compare`."""
import json, os, shutil, signal, socket, subprocess, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import pytest, torch

os.environ.setdefault('GRADIO_ANALYTICS_ENABLED', 'False')
from flowgrpo_nb import app as app_mod
from flowgrpo_nb.bank import ModelBank, fake_runs, find_models
from flowgrpo_nb.app import (generate_all, credit_view, make_app, serve, report_view, check_settings, check_prompt,
                             check_address, prune_files, QUEUE_SIZE)
from flowgrpo_nb.task import geneval_task, load_policy
from flowgrpo_nb.checkpoint import RunFolder
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
STEPS = 4      # small: the CPUs are shared
MAX_FILES = 6  # gallery images the served app keeps: small, so that pruning shows

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    out = fake_runs(tmp_path_factory.mktemp('runs')/'compare', methods=('flow_grpo', 'dense', 'turning_point'))
    RunFolder(out/'seed0'/'stepwise').write('config', {})
    (out/'seed0'/'stepwise'/'checkpoints').mkdir()  # started, nothing saved yet
    return out

@pytest.fixture(scope='module')
def bank(runs): return ModelBank(runs)

@pytest.fixture(scope='module')
def app(bank): return make_app(bank=bank, max_files=MAX_FILES)

def handler(app, api_name):
    return next(f.fn for f in app.fns.values() if f.api_name == api_name)

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def wait_port(port, proc=None, timeout=240):
    t = time.time()
    while time.time() - t < timeout:
        if proc is not None and proc.poll() is not None: raise AssertionError(f'the app exited with {proc.returncode}')
        with socket.socket() as s:
            if s.connect_ex(('127.0.0.1', port)) == 0: return
        time.sleep(0.5)
    raise AssertionError(f'nothing listens on port {port} after {timeout} s')

@pytest.fixture(scope='module')
def served(app):
    port = free_port()
    serve(app, port=port, block=False, quiet=True)
    yield f'http://127.0.0.1:{port}/'
    app.close()

def describe_grid(images, prompts):  # the hook a task may offer: what its detector reads (the grid world's here)
    from flowgrpo_nb.world import mini_geneval
    return [', '.join(f'{o.colour} {o.shape}' for o in s) or 'nothing' for s in mini_geneval(images, prompts).scenes]

# --- in-process ---

def test_models_found(bank):
    assert bank.names == ['base', 'seed0/dense', 'seed0/flow_grpo', 'seed0/turning_point']
    assert bank.skipped == ['seed0/stepwise: no checkpoint yet']
    assert len(bank._lanes['generate'].nets) == 1, 'runs of one LoRA shape share one network'
    assert bank.task.name == 'geneval-partial' and 'Scored by the task `geneval-partial`' in bank.message()

def test_every_event_has_api_name_and_group(app):
    groups = {f.api_name: (f.concurrency_id, f.concurrency_limit) for f in app.fns.values()}
    assert set(groups) == {'generate', 'generate_submit', 'report', 'credit', 'example', 'tab_generate', 'tab_report',
                           'tab_credit'}
    assert (groups['generate'] == groups['generate_submit'] == ('generate', app_mod.GENERATE_AT_ONCE)
            and groups['credit'] == ('credit', 1))
    assert groups['report'][0] == groups['example'][0] == groups['tab_report'][0] == 'light'
    assert app._queue.max_size == QUEUE_SIZE, 'the queue is bounded'

def test_generate_handler(app, bank):
    msg, images, table, strips = handler(app, 'generate')('a red circle', 3, STEPS, 4.0, 'ode')
    assert len(images) == len(bank.names) and len(strips.data) == min(len(bank.names), app_mod.PREVIEWS), msg
    _, _, _, picked = handler(app, 'generate')('a red circle', 3, STEPS, 4.0, 'ode', ['seed0/turning_point'])
    # previews of the picked models only, named as in display.STYLES
    assert [a.text for a in picked.layout.annotations] == ['TP-GRPO (seed0)']
    assert handler(app, 'generate')('a red circle', 3, STEPS, 4.0, 'ode', [])[3] is None
    # written whole to Gradio's cache by the handler, as Gradio names them
    from PIL import Image
    assert all(Image.open(f).size == (192, 192) and f in app.gallery.temp_files for f, _ in images)
    for name in bank.names: assert f'| {app_mod.model_label(name)} |' in table  # named as in the captions
    assert 'colors' in table and '| overall | partial | score |' in table
    assert ('| found |' in table) == hasattr(bank.task, 'describe') and not any('found' in c for _, c in images)
    assert strips.layout.xaxis.ticktext[-1].startswith(f'k={STEPS}<br>V=')

def test_describe_hook(runs):
    task = geneval_task('partial')
    task.describe = describe_grid
    b = ModelBank(runs, task=task, lanes=1)
    images, table, _ = app_mod.samples_view(generate_all(b, 'two circles', seed=0, steps=2, models=['base']))
    # what the task reads: in the table; the caption stays short
    assert 'found' not in images[0][1] and '| found |' in table

@pytest.mark.parametrize('typed', ['A RED Circle.', '  a red   circle ', 'a red circle!'])
def test_prompt_normalised(app, bank, typed):
    assert check_prompt(typed, bank.task) == 'a red circle'
    msg, images, *_ = handler(app, 'generate')(typed, 0, 2, 4.0, 'ode')
    assert len(images) == len(bank.names), msg

def test_same_noise_different_models(bank):
    a = generate_all(bank, 'a square', seed=5, steps=STEPS)
    b = generate_all(bank, 'a square', seed=5, steps=STEPS, models=['seed0/dense', 'base'])
    assert torch.equal(a[0].image, b[1].image) and torch.equal(a[1].image, b[0].image)
    assert not torch.equal(a[0].image, a[1].image), 'an adapter changes the image'
    for s in a: assert s.previews.shape == (STEPS + 1, 3, 32, 32) and len(s.values) == STEPS + 1

def test_sde_samplers(bank):
    for sampler in ('flow_sde', 'cps', 'ddim'):
        s = generate_all(bank, 'two circles', seed=0, steps=3, sampler=sampler, models=['base'])[0]
        assert 0 <= s.report.extra['partial'] <= 1 and s.category == 'counting'

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
    bank = ModelBank(runs/'seed0'/'stepwise', lanes=1)
    assert bank.names == ['base'] and 'No fine-tuned checkpoints' in bank.message()
    app = make_app(bank=bank)
    msg, images, *_ = handler(app, 'generate')('a circle', 0, 2, 4.0, 'ode')
    assert len(images) == 1, msg
    with pytest.raises(ValueError, match='not a folder'): find_models(runs/'missing')

def test_old_and_corrupt_adapters(runs, bank, tmp_path):
    "An older run's lora.safetensors (peft names, no metadata) loads; a corrupt adapter is skipped with its reason."
    old, new = RunFolder(tmp_path/'old'/'dense'), RunFolder(runs/'seed0'/'dense')
    for name in ('config', 'base'): old.write(name, new.read(name))
    old.write_checkpoint(1, {'lora.safetensors': bank.by_name['seed0/dense'].lora, 'state.json': dict(step=1)})
    bad = fake_runs(tmp_path/'bad', methods=('flow_grpo',), folder='x')/'x'/'flow_grpo'
    lora = next((bad/'checkpoints').iterdir())/'pytorch_lora_weights.safetensors'
    data = bytearray(lora.read_bytes()); data[-1] ^= 0xFF; lora.write_bytes(bytes(data))
    (tmp_path/'bad'/'x'/'flow_grpo').rename(tmp_path/'old'/'flow_grpo')
    b = ModelBank(tmp_path/'old', lanes=1)
    assert b.names == ['base', 'dense'], b.message()
    assert len(b.skipped) == 1 and b.skipped[0].startswith('flow_grpo: ') and 'corrupt' in b.skipped[0], b.skipped
    x = torch.randn(1, 3, 32, 32)
    with b.use('dense') as p: v_old = p.velocity(x, 0.5, p.encode(['a cross']), 4.0)
    with bank.use('seed0/dense') as p: v_new = p.velocity(x, 0.5, p.encode(['a cross']), 4.0)
    torch.testing.assert_close(v_old, v_new)

def test_several_bases(runs, tmp_path):
    "Runs of two bases: each loaded on its own (their fingerprints differ), or one picked with base=, the rest said."
    from flowgrpo_nb.tiny import load_tiny, save_tiny
    other = load_tiny()
    with torch.no_grad():
        for p in other.parameters(): p.add_(0.01 * torch.randn_like(p))
    path = tmp_path/'other.safetensors'
    save_tiny(other, path, dtype=torch.float32)
    mixed = fake_runs(tmp_path/'mixed', methods=('dense',), model_path=str(path), folder='other')
    fake_runs(mixed, methods=('flow_grpo',))
    b = ModelBank(mixed, lanes=1)
    assert b.names == [f'base (tiny:{path})', 'base (tiny)', 'other/dense', 'seed0/flow_grpo'] and not b.skipped, \
        b.message()
    x = torch.randn(1, 3, 32, 32)
    with b.use(f'base (tiny:{path})') as p: v_other = p.velocity(x, 0.5, p.encode(['a cross']), 4.0)
    with b.use('base (tiny)') as p: v_tiny = p.velocity(x, 0.5, p.encode(['a cross']), 4.0)
    assert (v_other - v_tiny).abs().mean() > 1e-4, 'each base is its own network'
    one = ModelBank(mixed, base='tiny', lanes=1)
    assert one.names == ['base', 'seed0/flow_grpo']
    assert one.skipped == ["other/dense: trained on base " + repr(f'tiny:{path}')
                           + ", not loaded (base 'tiny' was picked)"]
    assert 'skipped other/dense: trained on base' in one.message()
    with pytest.raises(ValueError, match=r"base='sd3:/nowhere': no run was trained on it; the runs' bases are"):
        ModelBank(mixed, base='sd3:/nowhere')
    with pytest.raises(ValueError, match="base='sdxl': allowed a model of"): ModelBank(mixed, base='sdxl')
    with pytest.raises(ValueError, match='one base policy given for runs of 2 bases'):
        ModelBank(mixed, policy=load_policy('tiny'))
    # a run whose base.json names other weights than its config's base is left out, and said
    RunFolder(mixed/'other'/'dense').write('config',
                                           RunFolder(mixed/'seed0'/'flow_grpo').config() | {'method': 'dense'})
    b = ModelBank(mixed, lanes=1)
    assert (b.names == ['base', 'seed0/flow_grpo'] and 'other/dense: ' in b.skipped[0]
            and 'other base weights' in b.skipped[0])

def test_lanes(bank, runs):
    """lanes=2: credit has its own networks and a Generate request is answered while a credit strip runs; lanes=1: one
    copy."""
    gen, cred = bank._lanes['generate'], bank._lanes['credit']
    assert gen is not cred and gen.lock is not cred.lock
    ids = lambda ln: {id(p) for net in ln.nets.values() for p in net.module.parameters()}
    assert not ids(gen) & ids(cred), 'the credit lane shares no parameter with the generate lane'
    with ThreadPoolExecutor(2) as ex:
        long = ex.submit(credit_view, bank, 'a red circle', 'seed0/dense', 0, 20)
        time.sleep(0.3)
        generate_all(bank, 'a cross', steps=2)
        assert not long.done(), 'the short request waited for the long one'
        long.result()
    one = ModelBank(runs, lanes=1)
    assert one._lanes['generate'] is one._lanes['credit']
    assert {f.concurrency_id for f in make_app(bank=one).fns.values() if f.api_name in ('generate', 'credit')} == \
        {'generate'}
    with pytest.raises(ValueError, match='lanes=3: allowed 1'): ModelBank(runs, lanes=3)

def test_credit_handler(app):
    msg, gain, preview, rows = handler(app, 'credit')('a circle and a square', 'seed0/dense', 0, STEPS, 4.0, 'flow_sde')
    assert gain is not None and preview is not None, msg
    assert {'advantages<br>dense', 'advantages<br>turning_point'} <= {a.text for a in gain.layout.annotations}
    msg, gain, *_ = handler(app, 'credit')('a circle', 'base', 0, 1, 4.0, 'flow_sde')
    assert gain is None and 'at least 2 steps' in msg

def test_credit_full_width_and_empty_turning_points_say_why(app):
    "The credit figures take the page's width; a group without turning points says why its table is empty."
    seen = []
    for seed in range(8):
        msg, gain, preview, rows = handler(app, 'credit')('a circle', 'base', seed, 3, 4.0, 'flow_sde')
        assert gain.layout.width is None and preview.layout.width is None and gain.layout.autosize, msg
        seen.append(bool(rows['value']))
        if not rows['value']:
            assert 'no turning point' in msg and rows['label'].startswith('turning points: none ('), msg
        else: assert rows['label'] == 'turning points' and 'no turning point' not in msg
    assert not all(seen), 'some small group has no turning point'

def test_first_screen_where_models_differ(bank, app):
    "The prompt box starts on the evaluation prompt whose images differ most across the models, already drawn."
    ranked = app_mod.rank_prompts(bank)
    spreads = [r[1:] for r in ranked]  # (gain over the base, spread of the score shown, of the reward)
    assert spreads == sorted(spreads, reverse=True) and spreads[0][2] > 0
    prompt = next(b for b in app.blocks.values() if getattr(b, 'elem_id', None) == 'prompt')
    gallery = app.gallery
    assert prompt.value == ranked[0][0] and len(gallery.value) == len(bank.names)
    # the box holds what the app accepts, and says so
    limit = app_mod.MAX_PROMPT_CHARS
    assert prompt.max_length == limit and f'at most {limit} characters' in prompt.info
    samples = generate_all(bank, ranked[0][0], 0, 10, 4.0, 'ode')
    scores = [s.report.overall for s in samples]
    assert max(scores) - min(scores) == pytest.approx(spreads[0][1]) and max(scores[1:]) - scores[0] == \
        pytest.approx(spreads[0][0]), \
        'the ranking scored the images as the tab shows them'

def test_models_listed_compactly(runs, tmp_path):
    "Many runs: one header line and a table by arm, each arm's runs in one cell."
    many = tmp_path/'many'
    for seed in ('seed0', 'seed1', 'seed2'):
        shutil.copytree(runs/'seed0', many/seed, ignore=shutil.ignore_patterns('stepwise'))
    bank = ModelBank(many, lanes=1)
    head, table = app_mod.models_view(bank)
    assert (head.startswith('**1 base and 9 fine-tuned models** (3 arms)') and '\n' not in head
            and 'seed1/dense' not in head)
    assert '| DenseGRPO (`dense`) | 3 | seed0, seed1, seed2 |' in table and len(table.splitlines()) == 5, table

def test_report(app, runs, tmp_path):
    none = [None] * len(app_mod.REPORT_FIGURES)
    head, md, figs, tasks = report_view(runs)
    assert 'No `report.json`' in head and md == '' and figs == none and tasks == []
    report = json.loads((ROOT/'results'/'compare'/'report.json').read_text())  # the committed report
    (tmp_path/'report.json').write_text(json.dumps(report))
    head, _, figs, _ = report_view(tmp_path)  # without its figure files: said, with the command that writes them
    assert figs == none and 'no figure files' in head and 'flowgrpo compare --out DIR' in head
    shutil.copytree(ROOT/'results'/'compare'/'figures', tmp_path/'figures', ignore=shutil.ignore_patterns('*.png'))
    for task in report['tasks']:  # every task of the report, each with its findings and its figures
        head, md, figs, tasks = report_view(tmp_path, task)
        assert tasks == list(report['tasks']) and f'task **{task}**' in head
        mine = [f for f in report['findings'] if f.startswith(f'[{task}] ')]
        assert mine and all(f.removeprefix(f'[{task}] ') in md for f in mine)
        # a report read before curves kept categories; the main job's figure
        assert all(f.layout.title.text.startswith(f'{task}:') if f is not None
                   else k in ('category_curves', 'reference')
                   for k, f in zip(app_mod.REPORT_FIGURES, figs)), task
    # format 1: refused, with the fix
    (tmp_path/'report.json').write_text(json.dumps(dict(per_seed={}, methods={}, findings=['old'])))
    head, md, figs, _ = report_view(tmp_path)
    assert 'cannot be read' in head and 'flowgrpo compare --out DIR' in head and figs == none
    (tmp_path/'report.json').write_text('{not json')
    head, md, figs, _ = report_view(tmp_path)
    assert 'cannot be read' in head and figs == none

def test_check_settings():
    assert check_settings(1, 10.0, 4, 'cps') == (1, 10, 4.0, 'cps', 0.7)
    with pytest.raises(ValueError, match='guidance'): check_settings(0, 10, float('nan'), 'ode')

def test_prune_files(tmp_path):
    class Component: temp_files = set()
    c = Component()
    for i in range(5):
        f = tmp_path/f'h{i}'/'image.webp'; f.parent.mkdir(); f.write_bytes(b'x')
        os.utime(f, (1000 + i, 1000 + i)); c.temp_files.add(str(f))
    assert prune_files(c, keep=2) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ['h3', 'h4'], 'the oldest files and their folders are gone'
    assert prune_files(c, keep=0) == 2 and not list(tmp_path.iterdir())

def test_prune_files_at_once(tmp_path):
    "Prunes running at once (one per Generate request) never fail on a file another one deleted, and keep the newest."
    import threading
    from types import SimpleNamespace
    c = SimpleNamespace(temp_files=set())
    for i in range(400):
        f = tmp_path/f'{i:03d}'/'image.webp'; f.parent.mkdir(); f.write_bytes(b'x')
        os.utime(f, (i, i)); c.temp_files.add(str(f))
    errors = []
    def prune():
        try: prune_files(c, keep=10)
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=prune) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert errors == [] and sorted(p.parent.name for p in tmp_path.glob('*/image.webp')) == \
        [f'{i:03d}' for i in range(390, 400)]

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
    jobs = [c.submit(p, i, 2, 4.0, 'ode', api_name='/generate')
            for i, p in enumerate(['a circle', 'a cross', 'three squares'])]
    assert [len(j.result(timeout=300)[1]) for j in jobs] == [len(bank.names)] * 3, 'the app keeps serving'

def test_long_request_does_not_block_short(served, bank):
    "A credit strip at many steps is queued in its own group: Generate requests submitted after it are answered first."
    from gradio_client import Client
    c = Client(served, verbose=False)
    long = c.submit('a red circle', 'seed0/dense', 0, 30, 4.0, 'flow_sde', api_name='/credit')
    time.sleep(1.0)
    t = time.perf_counter()
    for i in range(3):
        msg, images, *_ = c.predict('a cross', i, 2, 4.0, 'ode', api_name='/generate')
        assert len(images) == len(bank.names), msg
    short_s = time.perf_counter() - t
    assert not long.done(), f'the credit strip ended first: the Generate requests waited for it ({short_s:.1f} s)'
    msg, gain, *_ = long.result(timeout=600)
    assert gain is not None, msg

def test_short_generate_not_stuck_behind_long_ones(served, bank):
    "Long Generate requests submitted first do not hold back a 1-step one: it is answered while they still run."
    from gradio_client import Client
    c = Client(served, verbose=False)
    longs = [c.submit('three circles', i, 40, 4.0, 'ode', api_name='/generate') for i in range(3)]
    time.sleep(1.0)
    msg, images, *_ = c.predict('a cross', 0, 1, 4.0, 'ode', api_name='/generate')
    assert len(images) == len(bank.names), msg
    running = sum(not j.done() for j in longs)
    assert running >= 2, f'the 1-step request was answered after {3 - running} of the 3 long ones'
    answers = [j.result(timeout=600) for j in longs]  # every one waited for: none runs on into the next test
    assert all(len(a[1]) == len(bank.names) for a in answers), [a[0] for a in answers]

def test_generated_files_bounded(served, app, bank):
    "Gradio's cache keeps at most MAX_FILES of the gallery's images (plus the last answer's), older ones are deleted."
    from gradio_client import Client
    c = Client(served, verbose=False)
    seen = []
    for i in range(4):
        c.predict('a triangle', 100 + i, 2, 4.0, 'ode', api_name='/generate')
        seen.append({f for f in app.gallery.temp_files if os.path.isfile(f)})
    on_disk = seen[-1]
    assert len(on_disk) <= MAX_FILES + len(bank.names), len(on_disk)
    assert all(not os.path.exists(f) for f in seen[0] - on_disk) and seen[0] - on_disk, 'the oldest images were deleted'

def test_uploads_refused(served):
    "Every upload is refused, an empty one too, and none leaves a file behind."
    import httpx, tempfile
    cache = Path(os.environ.get('GRADIO_TEMP_DIR') or Path(tempfile.gettempdir())/'gradio')
    before = set(cache.rglob('*')) if cache.exists() else set()
    for body in (b'x' * 2048, b''):
        r = httpx.post(served + 'gradio_api/upload', files={'files': ('x.txt', body)}, timeout=30)
        assert r.status_code == 413 and 'uploads are refused' in r.text, (len(body), r.status_code, r.text)
    assert {p for p in (cache.rglob('*') if cache.exists() else ()) if p.name == 'x.txt'} - before == set()

# --- the command line ---

def run_cli(capsys, *argv) -> tuple[int, str]:
    "The exit status of `flowgrpo app ARGV` and what it printed on stderr."
    from flowgrpo_nb.cli import main
    capsys.readouterr()
    rc = main(['app', *argv])
    return rc, capsys.readouterr().err.strip()

def test_cli_bad_port_before_loading(monkeypatch, capsys):
    def no_load(*a, **k): raise AssertionError('a model was loaded before the port was checked')
    monkeypatch.setattr(app_mod, 'ModelBank', no_load)
    for port in ('0', '65536', '-1'):
        assert run_cli(capsys, '--port', port) == (2, f'flowgrpo app: port={port}: allowed an integer in [1, 65535]')
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0)); busy.listen()
        port = busy.getsockname()[1]
        rc, msg = run_cli(capsys, '--port', str(port))
    assert rc == 2 and msg.startswith(f'flowgrpo app: port {port} on 127.0.0.1 cannot be served '
                                      '(Address already in use)'), msg
    assert '\n' not in msg and msg.endswith('pick another with --port')
    assert run_cli(capsys, '--port', str(free_port()), '--threads', '-1') == \
        (2, 'flowgrpo app: threads=-1: allowed an integer >= 0')
    assert run_cli(capsys, '--port', str(free_port()), '--rank', '-2') == \
        (2, 'flowgrpo app: rank=-2: allowed an integer >= 0')

def test_cli_exit_code():
    r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'app', '--port', '70000'], capture_output=True,
                 text=True, timeout=300, env=os.environ | {'OMP_NUM_THREADS': '1'})
    lines = [l for l in r.stderr.splitlines() if 'torchvision' not in l]
    assert r.returncode == 2 and lines == ['flowgrpo app: port=70000: allowed an integer in [1, 65535]'], \
        (r.returncode, r.stderr)

def test_cli_serves_and_leaves_nothing(runs, tmp_path):
    """`flowgrpo app` in its own process: it serves, refuses uploads, and on SIGTERM exits 143 with one sentence and its
    temporary folder gone. `--rank 0`: no prompts ranked at start (`test_first_screen_where_models_differ` ranks)."""
    from gradio_client import Client
    import httpx
    tmp = tmp_path/'tmp'; tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != 'GRADIO_TEMP_DIR'} | dict(TMPDIR=str(tmp), OMP_NUM_THREADS='1')
    port = free_port()
    proc = warm.Popen([sys.executable, '-m', 'flowgrpo_nb.cli', 'app', '--runs', str(runs), '--port', str(port),
                       '--rank', '0'],
                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_port(port, proc)
        private = [p for p in tmp.iterdir() if p.name.startswith('flowgrpo-app-')]
        assert len(private) == 1, list(tmp.iterdir())
        msg, images, *_ = Client(f'http://127.0.0.1:{port}/', verbose=False).predict('A Cross.', 0, 2, 4.0, 'ode',
                                                                                     api_name='/generate')
        assert len(images) == 4, msg
        assert any(private[0].rglob('*.webp')), 'the gallery images are written to the private folder'
        assert httpx.post(f'http://127.0.0.1:{port}/gradio_api/upload', files={'files': ('x', b'x' * 100)},
                          timeout=30).status_code == 413
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:]
    assert out.splitlines()[-1] == f'flowgrpo app: stopped by SIGTERM: the server on 127.0.0.1:{port} is closed', \
        out[-2000:]
    assert not private[0].exists(), f'left behind: {list(private[0].rglob("*"))}'
    # what it loads, said first; then where it serves
    loading, serving = (next((i for i, l in enumerate(out.splitlines()) if l.startswith(s)), None)
                        for s in (f'loading 3 fine-tuned models and their base from {runs}',
                                  f'serving at http://127.0.0.1:{port}'))
    assert loading is not None and serving is not None and loading < serving, out[-2000:]

# --- a real browser ---

CAPTIONS = """() => [...document.querySelectorAll('#images .caption-label')].map(c => {
    const b = c.getBoundingClientRect(), item = c.closest('.thumbnail-item');
    const img = item.querySelector('img').getBoundingClientRect(), cut = [];
    if (c.scrollHeight > c.clientHeight + 1 || c.scrollWidth > c.clientWidth + 1) cut.push('its text overflows it');
    if (b.top < img.bottom - 1) cut.push('it overlaps its image');
    if (b.left < -1 || b.right > innerWidth + 1) cut.push('off the window');
    for (let a = c.parentElement; a; a = a.parentElement) {  // any ancestor that clips (overflow not visible)
        const s = getComputedStyle(a), r = a.getBoundingClientRect();
        if ((s.overflowX !== 'visible' || s.overflowY !== 'visible') && (b.left < r.left - 1 || b.top < r.top - 1
            || b.right > r.right + 1 || b.bottom > r.bottom + 1)) cut.push(`cut by ${a.tagName}.${a.className}`);
    }
    const top = Math.round(item.getBoundingClientRect().top);
    return {text: c.textContent, top, box: [b.left, b.top, b.right, b.bottom], cut};
})"""

def captions_cut(page) -> tuple[list, int]:
    "The gallery's captions not fully visible, with why (text overflowing, on the image, cut by an ancestor); its rows."
    caps = page.evaluate(CAPTIONS)
    return [(c['text'], c['box'], c['cut']) for c in caps if c['cut']], len({c['top'] for c in caps})

def wait_images(page, n:int):
    "Until the gallery shows `n` images, every one loaded and laid out."
    page.wait_for_function(f'(() => {{ const a = [...document.querySelectorAll("#images img")]; return a.length >= {n}'
                           f' && a.every(i => i.complete && i.getBoundingClientRect().height > 0); }})()',
                           timeout=180_000)

@pytest.mark.chrome
def test_browser_generate(chromium, served, bank, tmp_path):
    page = chromium.new_page(viewport=dict(width=1280, height=800))
    page.goto(served, wait_until='load')
    box = page.locator('#prompt textarea')
    box.wait_for(timeout=60_000)
    box.fill('a purple circle')
    page.locator('#generate').click()
    page.get_by_text("unknown words ['purple']").wait_for(timeout=120_000)
    wide = page.evaluate("(() => { const p = document.querySelector('#status pre'), r = p.getBoundingClientRect();"
                         " return [p.scrollWidth, p.clientWidth, r.right, window.innerWidth]; })()")
    assert wide[0] <= wide[1] + 1 and wide[2] <= wide[3], wide  # the message wraps: no vocabulary off the right edge
    box.fill('A green triangle.')
    page.locator('#generate').click()
    n = len(bank.names)
    wait_images(page, n)
    imgs = page.locator('#images img').count()
    sizes = page.evaluate("[...document.querySelectorAll('#images img')]"
                          ".map(i => [i.getBoundingClientRect().width, i.getBoundingClientRect().height])")
    cut, rows = captions_cut(page)
    page.screenshot(path=str(tmp_path/'app.png'), full_page=True)
    assert imgs == n, (imgs, n)
    # captions of any length: every image one size
    assert max(h for _, h in sizes) - min(h for _, h in sizes) <= 1, sizes
    assert max(w for w, _ in sizes) < 1280 / app_mod.GALLERY_COLUMNS, sizes  # a thumbnail, not a 32-px image blown up
    assert rows == 1 and not cut, (rows, cut)
    page.set_viewport_size(dict(width=640, height=800))  # a narrow window: the gallery wraps its models over rows
    page.wait_for_function("new Set([...document.querySelectorAll('#images .thumbnail-item')]"
                           ".map(i => Math.round(i.getBoundingClientRect().top))).size > 1", timeout=10_000)
    cut, rows = captions_cut(page)
    page.screenshot(path=str(tmp_path/'app-narrow.png'), full_page=True)
    assert rows >= 2 and not cut, (rows, cut)  # every row's captions seen whole, the last row's too

@pytest.mark.chrome
def test_browser_confirm_captions(chromium, tmp_path):
    "`flowgrpo app --runs results/confirm` at 1280 x 800: six models on two rows, every caption (two lines) seen whole."
    app = make_app(bank=ModelBank(ROOT/'results'/'confirm', lanes=1), rank=0)
    port = free_port()
    serve(app, port=port, block=False, quiet=True)
    try:
        page = chromium.new_page(viewport=dict(width=1280, height=800))
        page.goto(f'http://127.0.0.1:{port}/', wait_until='load')
        page.locator('#prompt textarea').fill('a red circle and a blue square')
        page.locator('#generate').click()
        wait_images(page, len(app.bank.names))
        cut, rows = captions_cut(page)
        page.screenshot(path=str(tmp_path/'confirm.png'), full_page=True)
    finally: app.close()
    assert len(app.bank.names) == 6 and rows == 2, (app.bank.names, rows)
    assert not cut, cut

SCORES = """() => [...document.querySelectorAll('#scores tr')].map(r => [...r.querySelectorAll('th, td')]
    .map(c => [c.innerText.trim(), c.getBoundingClientRect().bottom]))"""

@pytest.mark.chrome
def test_browser_confirm_first_screen(chromium, tmp_path):
    """`flowgrpo app --runs results/confirm` at 1280 x 800, unscrolled: each model's name and held-out score at the top
    under the names the captions and the picker use, and a first prompt where the base and a fine-tuned model differ."""
    confirm = ROOT/'results'/'confirm'
    app = make_app(bank=ModelBank(confirm, lanes=1))
    names = app.bank.names
    port = free_port()
    serve(app, port=port, block=False, quiet=True)
    try:
        page = chromium.new_page(viewport=dict(width=1280, height=800))
        page.goto(f'http://127.0.0.1:{port}/', wait_until='load')
        wait_images(page, len(names))
        table = page.evaluate(SCORES)
        captions = page.locator('#images .caption-label').all_inner_texts()
        picked = page.locator('#previews').inner_text()
        page.screenshot(path=str(tmp_path/'confirm-first.png'))
    finally: app.close()
    labels, scores = [app_mod.model_label(n) for n in names], app_mod.heldout_scores(confirm, names)
    assert len(names) == 6 and [c[0] for c in table[0][1:]] == labels, table
    assert [c[0] for c in table[1][1:]] == [f'{scores[n][0]:.3f}' for n in names], table  # each run's score
    assert all(0 < bottom <= 800 for row in table for _, bottom in row), table  # all of it on the first screen
    shown = dict(c.rsplit(': ', 1) for c in captions)
    assert list(shown) == labels and all(l in picked for l in labels[:app_mod.PREVIEWS]), (captions, picked)
    assert any(float(v) != float(shown[labels[0]]) for v in list(shown.values())[1:]), captions

def test_cli_flags():
    from fastcore.script import anno_parser
    from flowgrpo_nb.app import app_cli
    a = anno_parser(app_cli).parse_args(['--runs', 'runs/compare', '--port', '7861', '--base', 'tiny'])
    assert (a.runs, a.base, a.host, a.port, a.threads, a.lanes, a.share) == \
        ('runs/compare', 'tiny', '127.0.0.1', 7861, 1, 2, False)

# --- the committed results: a study without checkpoints ---

STUDY = ROOT/'results'/'study'

@pytest.fixture(scope='module')
def study_apps():
    "The app on the committed study, opened on the study folder and on its runs folder."
    return {str(p): make_app(bank=ModelBank(p, lanes=1)) for p in (STUDY, STUDY/'runs')}

def test_committed_study_opens_on_its_report(study_apps):
    # the runs the study finished, their checkpoints not committed
    finished = len(list((STUDY/'runs').rglob('summary.json')))
    assert finished > 10
    for where, app in study_apps.items():
        bank = app.bank
        assert bank.names == ['base'] and len(bank.kept) == finished, (where, len(bank.kept))
        msg = bank.message()
        assert (f'{finished} runs kept without checkpoints' in msg and 'report and curves only' in msg
                and 'flowgrpo train' in msg)
        assert 'skipped' not in msg and len(msg.splitlines()) <= 4, msg  # one line, not a bullet per run
        head, md, figs, tasks = report_view(bank.runs)
        assert (head.startswith(f'Report: `{STUDY/"report.json"}`') and md.startswith('- ')
                and figs[app_mod.REPORT_FIGURES.index('curve_steps')] is not None), head
        controls = next(b for b in app.blocks.values() if getattr(b, 'elem_id', None) == 'controls')
        assert controls.visible is False, \
            'the prompt and sampling controls are hidden on the Report tab the app opens on'
        gen, rep = handler(app, 'tab_generate')(), handler(app, 'tab_report')()  # (controls, generate, report, credit)
        assert (gen[0]['visible'] is True and gen[1]['visible'] is True and rep[0]['visible'] is False
                and rep[2]['visible'] is True)

@pytest.mark.chrome
def test_browser_committed_study_first_screen(chromium, study_apps, tmp_path):
    "At 1280 x 800 the committed study shows its report and its curves on the first screen, no list of skipped runs."
    for i, (where, app) in enumerate(study_apps.items()):
        port = free_port()
        serve(app, port=port, block=False, quiet=True)
        try:
            page = chromium.new_page(viewport=dict(width=1280, height=800))
            page.route('**/*', lambda r: r.continue_() if r.request.url.startswith('http://127.0.0.1') else r.abort())
            page.goto(f'http://127.0.0.1:{port}/', wait_until='load')
            page.locator('#report-curve_steps .main-svg').first.wait_for(timeout=120_000)
            head = page.locator('#report-head').bounding_box()
            plot = page.locator('#report-curve_steps .main-svg').first.bounding_box()
            text = page.locator('body').inner_text()
            page.screenshot(path=str(tmp_path/f'study{i}.png'))
            assert head and head['y'] + head['height'] < 800, (where, head)
            assert plot and plot['y'] + plot['height'] / 2 < 800, (where, plot)  # half the curves above the fold
            assert 'skipped' not in text and 'No `report.json`' not in text and 'No report.json' not in text, where
            assert not page.locator('#prompt').is_visible(), 'the prompt box is hidden on the Report tab'
            page.get_by_role('tab', name='Generate').click()
            page.locator('#prompt').wait_for(state='visible', timeout=30_000)
            page.close()
        finally: app.close()

def test_help_says_how_to_open_the_committed_results():
    from fastcore.script import anno_parser
    from flowgrpo_nb.app import app_cli
    assert 'flowgrpo app --runs results/confirm' in ' '.join(anno_parser(app_cli).format_help().split())
    assert ('flowgrpo app --runs runs/compare` browses the runs, '
            '`--runs results/confirm`') in (ROOT/'README.md').read_text()

def _api(served, name, data):
    "Call the app's HTTP API as any client would (no gradio_client): the server-sent events of one call, as text."
    import json as js, urllib.request
    req = urllib.request.Request(f'{served}gradio_api/call/{name}', data=js.dumps(dict(data=data)).encode(),
                                 headers={'Content-Type': 'application/json'})
    event = js.loads(urllib.request.urlopen(req, timeout=60).read())['event_id']
    return urllib.request.urlopen(f'{served}gradio_api/call/{name}/{event}', timeout=120).read().decode()

def _post(served, path, body:bytes):
    "POST `body` to the served app: (status, text of the answer)."
    import urllib.request, urllib.error
    req = urllib.request.Request(served + path, data=body, headers={'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(req, timeout=60) as r: return r.status, r.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.read().decode()

def test_api_refusals_say_why(served):
    "A seed too large for numpy or not an integer: the handler's sentence (no TypeError, no `null`, 1.5 not rounded)."
    big = _api(served, 'generate', ['A Cross.', 2**70, 2, 4.0, 'ode', ['base']])
    assert 'seed=1180591620717411303424: allowed an integer in [0, 2147483647]' in big and 'TypeError' not in big, big
    half = _api(served, 'generate', ['A Cross.', 1.5, 2, 4.0, 'ode', ['base']])
    assert 'seed=1.5: allowed an integer in [0, 2147483647]' in half, half

@pytest.mark.parametrize('path,data,status,says', [
    ('call/generat', ['A Cross.'], 404, "no API name 'generat': allowed "),
    ('run/nothing', [], 404, "no API name 'nothing': allowed "),
    ('call/generate', ['A Cross.'], 422,
     "/generate takes 6 arguments (prompt, seed (an integer), steps (1–100), CFG, sampler, "),
    ('call/generate', ['A Cross.', 'abc', 2, 4.0, 'ode', ['base']], 422,
     "/generate: argument 2 (seed (an integer)) is 'abc', not a number"),
    ('call/generate', ['A Cross.', 0, 2, 4.0, 'ode', 'base'], 422,
     "/generate: argument 6 (Tweedie previews of (the strips below)) is 'base', not a list of strings"),
    ('call/credit', [1, 'base', 0, 2, 4.0, 'flow_sde'], 422, '/credit: argument 1 (prompt) is 1, not a string'),
    ('call/generate', {'prompt': 'A Cross.'}, 422, "/generate takes 6 arguments"),
])
def test_malformed_calls_refused_in_one_sentence(served, capfd, path, data, status, says):
    "Wrong type, wrong number of arguments, unknown API name: a 4xx and one sentence, no traceback in the log."
    got, text = _post(served, 'gradio_api/' + path, json.dumps(dict(data=data)).encode())
    why = json.loads(text)['error']
    assert got == status and why.startswith(says) and '\n' not in why, (got, text)
    assert 'Traceback' not in capfd.readouterr().err

def test_huge_input_is_not_echoed(served, capfd):
    """A 20 MB string is refused by its size: neither the answer nor the log repeats it; a 5000-character one is named
    by its length."""
    s = 'x' * 20_000_000
    got, text = _post(served, 'gradio_api/call/generate',
                      json.dumps(dict(data=['A Cross.', 0, 2, 4.0, s, ['base']])).encode())
    assert got == 413 and len(text) < 200 and 'allowed at most 65536' in text, (got, text[:300])
    got, text = _post(served, 'gradio_api/call/generate',
                      json.dumps(dict(data=['A Cross.', 0, 2, 4.0, 'y' * 5000, ['base']])).encode())
    assert got == 422 and len(text) < 200 and 'a string of 5000 characters' in text, (got, text[:300])
    out = capfd.readouterr()
    assert 'xxxxxxxxxx' not in out.out + out.err and 'yyyyyyyyyy' not in out.out + out.err
    got, sampler = _post(served, 'gradio_api/call/generate',
                         json.dumps(dict(data=['A Cross.', 0, 2, 4.0, 'z' * 900, ['base']])).encode())
    assert (got == 422 and sampler.count('z') < 100
            and 'string of 900 characters that is none of its choices' in sampler), sampler[:3000]

def test_a_full_disk_in_the_image_cache_is_one_sentence_and_leaves_no_empty_image(app, bank, monkeypatch):
    """The gallery's images are written by the handler, whole: a full disk is the app's sentence naming the file (no
    numpy dump, no traceback), no empty image.webp is left, and the next request with space is whole."""
    import errno
    from PIL import Image
    from flowgrpo_nb import checkpoint
    write = checkpoint._fsync_write
    def full(path, data):
        if Path(path).name.startswith('.tmp-image'): raise OSError(errno.ENOSPC, 'No space left on device')
        write(path, data)
    with monkeypatch.context() as m:
        m.setattr(checkpoint, '_fsync_write', full)
        msg, images, _, _ = handler(app, 'generate')('a blue cross', 77, STEPS, 4.0, 'ode')
    assert images == [] and 'Cannot write' in msg and 'image.webp: No space left on device' in msg, msg
    assert 'array(' not in msg and 'Traceback' not in msg
    cache = Path(app.gallery.GRADIO_CACHE)
    assert not [f for f in cache.rglob('*.webp') if f.stat().st_size == 0] and not list(cache.rglob('.tmp-*'))
    _, images, _, _ = handler(app, 'generate')('a blue cross', 77, STEPS, 4.0, 'ode')
    assert len(images) == len(bank.names) and all(Image.open(f).size == (192, 192) for f, _ in images)

def test_analytics_off(app):
    assert app.analytics_enabled is False

def test_keyword_calls_and_queue_data_are_checked_by_the_door(served, capfd):
    """/call/v2 with an unknown keyword or a value of the wrong type: a 422 and one sentence (Gradio's is a 500);
    the queue's messages of a session it does not hold: a 404 and one sentence; no traceback in the log."""
    import urllib.request, urllib.error
    for body, says in [({'prompt': 'A Cross.', 'colour': 'red'}, "/generate has no argument 'colour'"),
                       ({'prompt': 'A Cross.', 'previews': 'base'},
                        "/generate: argument 'previews' is 'base', not a list"),
                       ({'prompt': 'A Cross.', 'seed': 'one'}, "/generate: argument 'seed' is 'one', not a number")]:
        got, text = _post(served, 'gradio_api/call/v2/generate', json.dumps(body).encode())
        why = json.loads(text)['error']
        assert got == 422 and why.startswith(says) and '\n' not in why, (got, text)
    try: urllib.request.urlopen(f'{served}gradio_api/queue/data?session_hash=nobody', timeout=60); got = 200
    except urllib.error.HTTPError as e: got, text = e.code, e.read().decode()
    assert got == 404 and 'no such session' in json.loads(text)['error'], (got, text)
    assert 'Traceback' not in capfd.readouterr().err
