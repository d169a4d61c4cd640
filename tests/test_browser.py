"""A real browser reads the docs pages offline: the quickstart and the credit notebook (05_credit), built by
`tools/docs.py` (executed in a Jupyter kernel, nbdev's processing, nbconvert), opened in Debian's Chromium at a
1280-px window with every request to another host blocked. Every figure must have drawn its SVG, no wider than the
page's output area; the build leaves nothing in the tree. A dashboard's widgets are drawn from their stored state
(checked on a small state here; `python tools/docs.py` draws 07_viz's)."""
import importlib.util, re, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path('/usr/bin/chromium')
ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking']
PAGES = ('tutorials/quickstart.ipynb', '05_credit.ipynb')

def _docs():
    spec = importlib.util.spec_from_file_location('docs', ROOT/'tools'/'docs.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod

def _tree() -> str: return subprocess.run(['git', 'status', '--porcelain', '--ignored'], cwd=ROOT, capture_output=True, text=True).stdout

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    out, before = tmp_path_factory.mktemp('site'), _tree()
    written = _docs().build(out, PAGES, log=lambda s: None)
    assert _tree() == before, 'the docs build left files in the tree'
    return out, written

def test_pages_and_navigation(site):
    out, written = site
    assert [p.relative_to(out).as_posix() for p in written] == ['tutorials/quickstart.html', '05_credit.html']
    page = (out/'05_credit.html').read_text()
    order = [Path(p).with_suffix('.html').as_posix() for p in map(str, _docs().pages())]
    assert order[0] == 'index.html' and order.index('00_flow.html') < order.index('05_credit.html') < order.index('tutorials/quickstart.html')
    hrefs = re.findall(r"<nav class='sidebar'>(.*?)</nav>", page, flags=re.S)[0]
    assert re.findall(r"href='([^']+)'", hrefs) == order  # the sidebar: every page, nbdev's order
    assert "href='tutorials/quickstart.html'>Quickstart</a>" in page  # the navbar of nbs/_quarto.yml
    assert not re.search(r'''(src|href)=["']https?://[^"']*(plotly|unpkg|jsdelivr|cdn)''', page), 'a page loads from a CDN'
    assert 'requires torchvision' not in page + (out/'tutorials'/'quickstart.html').read_text()  # third-party notices dropped

@pytest.mark.chrome
def test_figures_draw_offline_within_the_output_area(site):
    if not CHROMIUM.exists(): pytest.skip('needs Debian chromium at /usr/bin/chromium (apt-get install -y chromium)')
    pw = pytest.importorskip('playwright.sync_api', reason='needs the playwright python package')
    out, _ = site
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport=dict(width=1280, height=900))
        errors, other_hosts = [], []
        page.on('pageerror', lambda e: errors.append(str(e)))
        page.route('**/*', lambda r: r.continue_() if r.request.url.startswith('file:') else (other_hosts.append(r.request.url), r.abort()))
        for name in ('tutorials/quickstart.html', '05_credit.html'):
            page.goto((out/name).as_uri(), wait_until='load')
            n = page.locator('.plotly-graph-div').count()
            page.wait_for_function(f'document.querySelectorAll(".plotly-graph-div .main-svg").length >= {n}', timeout=60_000)
            area = page.evaluate("document.querySelector('main .jp-Notebook, main').getBoundingClientRect().right")
            drawn = page.evaluate("[...document.querySelectorAll('.main-svg')].map(s => s.getBoundingClientRect())"
                                  ".filter(r => r.width > 0).map(r => [r.left, r.right, r.width])")
            assert n >= (5 if 'quickstart' in name else 2), (name, n)
            assert drawn and all(right <= area + 1 and width <= 840 for _, right, width in drawn), (name, area, drawn)
            page.screenshot(path=str(out/f'{Path(name).stem}.png'), full_page=True)
        browser.close()
    assert not errors, errors
    assert not other_hosts, other_hosts

def test_widgets_drawn_from_their_state():
    "A dashboard as nbclient stores it (a Tab of an Output with a figure and a hidden slider, a Dropdown) drawn as static HTML."
    docs = _docs()
    fig = {'data': [{'type': 'bar', 'y': [1, 2]}], 'layout': {'title': {'text': 'in a tab'}}}
    W = lambda name, **st: {'model_name': name, 'model_module': '@jupyter-widgets/controls', 'state': st}
    state = {'tab': W('TabModel', children=['IPY_MODEL_out', 'IPY_MODEL_box'], titles=['training', 'calibration'], selected_index=0),
             'out': W('OutputModel', outputs=[{'output_type': 'display_data', 'data': {docs.PLOTLY_MIME: fig}, 'metadata': {}}]),
             'box': W('VBoxModel', children=['IPY_MODEL_hidden', 'IPY_MODEL_run']),
             'hidden': W('IntSliderModel', value=0, min=0, max=0, description='round', layout='IPY_MODEL_lay'),
             'lay': W('LayoutModel', display='none'),
             'run': W('DropdownModel', _options_labels=['dense', 'turning_point'], index=1, description='run')}
    html = docs.widget_html('tab', state)
    assert html.count("<button class='w-tab-head") == 2 and '>training</button>' in html and '>calibration</button>' in html
    assert 'Plotly.newPlot' in html and 'in a tab' in html  # the figure, drawn with the page's plotly.js
    assert 'round' not in html  # a hidden control is not drawn
    assert "<label>run</label> <span class='w-value'>turning_point</span>" in html
