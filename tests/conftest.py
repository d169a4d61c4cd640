"""Fixtures shared by the test files: the small tiny-model config, tiny random SD3 and FLUX policies, a tiny random CLIP
folder (all built locally, nothing downloaded)."""
import pytest
import torch
import warm  # python commands in a warm interpreter (tests/warm.py)

torch.set_num_threads(1)


@pytest.fixture(scope='module')
def base():
    "The shipped tiny policy and the embedded partial-credit task (tests deep-copy the policy before training it)."
    from flowgrpo_nb.task import load_policy, load_task
    return load_policy('tiny'), load_task('partial', None, None, 'tiny')


@pytest.fixture(scope='session')
def small_config():
    """The tests' small `TinyConfig`: a 1-layer text encoder and 2 SD3 blocks of 2 heads x 16 (every LoRA target
    present)."""
    from flowgrpo_nb.tiny import TinyConfig
    return TinyConfig(text_dim=32, text_heads=2, text_layers=1, pooled_dim=32, num_layers=2, num_heads=2, head_dim=16)


@pytest.fixture
def tiny_policy(small_config):
    "A fresh `TinyPolicy` over a random model of `small_config` (seed 0)."
    from flowgrpo_nb.tiny import TinyFlowModel, TinyPolicy
    torch.manual_seed(0)
    return TinyPolicy(TinyFlowModel(small_config))


@pytest.fixture(scope='session')
def make_sd3():
    """Builds an `SD3Policy` (32 px, 8 T5 tokens) over a fresh tiny random SD3 pipeline; the same seed gives the same
    weights."""
    from flowgrpo_nb.sd3 import SD3Policy, tiny_sd3_pipeline
    def make(dtype=torch.float32, seed=0, **kw):
        return SD3Policy(tiny_sd3_pipeline(seed, dtype), resolution=32, max_sequence_length=8, **kw)
    return make


@pytest.fixture(scope='session')
def make_flux():
    """Builds a `FluxPolicy` (32 px, 16 T5 tokens) over a fresh tiny random FLUX pipeline (`guidance_embeds=False`:
    schnell-like)."""
    from flowgrpo_nb.flux import FluxPolicy, tiny_flux_pipeline
    def make(dtype=torch.float32, seed=0, guidance_embeds=True, **kw):
        return FluxPolicy(tiny_flux_pipeline(seed, dtype, guidance_embeds), resolution=32, max_sequence_length=16, **kw)
    return make


@pytest.fixture(scope='session')
def clip_folder(tmp_path_factory):
    "A local folder with a tiny random CLIP model (`rewards.tiny_clip_folder`), for `CLIPScore.from_pretrained`."
    from flowgrpo_nb.rewards import tiny_clip_folder
    return tiny_clip_folder(tmp_path_factory.mktemp('clip'))



@pytest.fixture(scope='session')
def shared_cache(tmp_path_factory):
    """`cached(name, make) -> folder`: the folder `name`, made once per pytest run by `make(folder)` and shared by the
    xdist workers (a file lock: the first to ask makes it, the others wait, then read it). Its users only read it:
    expensive set-up (the straight training runs) is done once, whichever test file asks first."""
    import os, shutil
    from filelock import FileLock
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base  # the run's folder, above each worker's
    def cached(name:str, make):
        d = root/f'shared-{name}'
        with FileLock(f'{d}.lock'):
            if not (d/'.made').exists():
                shutil.rmtree(d, ignore_errors=True)  # a make that failed before: made again
                d.mkdir()
                make(d)
                (d/'.made').touch()
        return d
    return cached

CHROMIUM = '/usr/bin/chromium'  # Debian's
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking']

@pytest.fixture
def chromium():
    "Debian's Chromium, headless, as a Playwright `Browser`, closed after the test; skips without it or playwright."
    from pathlib import Path
    if not Path(CHROMIUM).exists(): pytest.skip(f'needs Debian chromium at {CHROMIUM} (apt-get install -y chromium)')
    pw = pytest.importorskip('playwright.sync_api', reason='needs the playwright python package')
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


HOLD = ("import sys, time\nfrom flowgrpo_nb.checkpoint import FolderLock\n"
        "lock = FolderLock(sys.argv[1], sys.argv[2])\nprint('held', flush=True)\ntime.sleep(600)")

@pytest.fixture
def lock_holder():
    """Starts another process that takes a folder's writer lock (`FolderLock(folder, what)`) and waits: `hold(folder,
    what) -> Popen`."""
    import subprocess, sys
    procs = []
    def hold(folder, what='a trainer'):
        p = warm.Popen([sys.executable, '-c', HOLD, str(folder), what], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == 'held', 'the child did not take the lock'
        return p
    yield hold
    for p in procs:
        p.kill(); p.wait(); p.stdout.close()


# ---- the order of the test files, and their seconds (tools/check.py: see its docstring)
import json, os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_SECONDS:dict[str, float] = {}

def _file_key(times:dict, path:Path):
    "Longest first by the recorded seconds; a file never recorded before them, larger files first (as check.py)."
    t = times.get(str(path.relative_to(_ROOT)))
    return (t is not None, -(t or 0), -path.stat().st_size, str(path))

def pytest_collection_modifyitems(config, items):
    """Test files longest first (tools/test_times.json), so that `--dist loadfile` gives the heavy ones out first and
    the workers end together; the tests of a file keep their order."""
    try: times = json.loads((_ROOT/'tools'/'test_times.json').read_text())
    except (OSError, ValueError): times = {}
    keys = {p: _file_key(times, p) for p in {Path(it.path).resolve() for it in items}}
    items.sort(key=lambda it: keys[Path(it.path).resolve()])

def pytest_runtest_logreport(report):
    "Each test file's seconds (set-up, call and tear-down of its tests), summed where the reports arrive."
    _SECONDS[report.nodeid.split('::')[0]] = _SECONDS.get(report.nodeid.split('::')[0], 0.0) + report.duration

def pytest_sessionfinish(session):
    "With FLOWGRPO_TEST_TIMES=FILE (tools/check.py --record-times): write the files' seconds there (not on a worker)."
    out = os.environ.get('FLOWGRPO_TEST_TIMES')
    if out and not hasattr(session.config, 'workerinput'):
        Path(out).write_text(json.dumps({k: round(v, 1) for k, v in sorted(_SECONDS.items())}, indent=1))
