"""A real browser reads the docs pages offline: the quickstart and the credit notebook (05_credit), built by
`tools/docs.py` (executed in a Jupyter kernel, nbdev's processing, nbconvert), opened in Debian's Chromium at a
1280-px window with every request to another host blocked. Every figure must have drawn its SVG, no wider than the
page's output area; the build leaves nothing in the tree. A dashboard's widgets are drawn from their stored state
(checked on a small state here; `python tools/docs.py` draws 07_viz's)."""
import importlib.util, re, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ('tutorials/quickstart.ipynb', '05_credit.ipynb')

def _docs():
    spec = importlib.util.spec_from_file_location('docs', ROOT/'tools'/'docs.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod

def _tree() -> str:
    return subprocess.run(['git', 'status', '--porcelain', '--ignored'], cwd=ROOT, capture_output=True,
                          text=True).stdout

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
    assert (order[0] == 'index.html'
            and order.index('00_flow.html') < order.index('05_credit.html') < order.index('tutorials/quickstart.html'))
    hrefs = re.findall(r"<nav class='sidebar'>(.*?)</nav>", page, flags=re.S)[0]
    assert re.findall(r"href='([^']+)'", hrefs) == order  # the sidebar: every page, nbdev's order
    assert "href='tutorials/quickstart.html'>Quickstart</a>" in page  # the navbar of nbs/_quarto.yml
    assert not re.search(r'''(src|href)=["']https?://[^"']*(plotly|unpkg|jsdelivr|cdn)''', page), \
        'a page loads from a CDN'
    # third-party notices dropped
    assert 'requires torchvision' not in page + (out/'tutorials'/'quickstart.html').read_text()

@pytest.mark.chrome
def test_figures_draw_offline_within_the_output_area(chromium, site):
    out, _ = site
    page = chromium.new_page(viewport=dict(width=1280, height=900))
    errors, other_hosts = [], []
    page.on('pageerror', lambda e: errors.append(str(e)))
    page.route('**/*', lambda r: r.continue_() if r.request.url.startswith('file:')
               else (other_hosts.append(r.request.url), r.abort()))
    for name in ('tutorials/quickstart.html', '05_credit.html'):
        page.goto((out/name).as_uri(), wait_until='load')
        n = page.locator('.plotly-graph-div').count()
        page.wait_for_function(f'document.querySelectorAll(".plotly-graph-div .main-svg").length >= {n}',
                               timeout=60_000)
        area = page.evaluate("document.querySelector('main .jp-Notebook, main').getBoundingClientRect().right")
        drawn = page.evaluate("[...document.querySelectorAll('.main-svg')].map(s => s.getBoundingClientRect())"
                              ".filter(r => r.width > 0).map(r => [r.left, r.right, r.width])")
        assert n >= (5 if 'quickstart' in name else 2), (name, n)
        assert drawn and all(right <= area + 1 and width <= 840 for _, right, width in drawn), (name, area, drawn)
        page.screenshot(path=str(out/f'{Path(name).stem}.png'), full_page=True)
    assert not errors, errors
    assert not other_hosts, other_hosts

@pytest.mark.chrome
def test_the_step_slider_works_in_the_built_page(chromium, site):
    "The quickstart's step_figure, in the docs read offline with no kernel: moving its slider shows another step."
    out, _ = site
    page = chromium.new_page(viewport=dict(width=1280, height=900))
    page.goto((out/'tutorials'/'quickstart.html').as_uri(), wait_until='load')
    page.wait_for_function('[...document.querySelectorAll(".plotly-graph-div")]'
                           '.some(g => g.layout && g.layout.sliders)', timeout=60_000)
    state = ("() => { const g = [...document.querySelectorAll('.plotly-graph-div')].find(g => g.layout.sliders);"
             " return [g.layout.title.text, g.layout.sliders[0].active,"
             " g.data.filter(d => d.mode === 'markers').map(d => d.x[0])] }")
    title0, active0, marks0 = page.evaluate(state)
    assert active0 == 0 and set(marks0) == {0} and 'step k = 0 of' in title0, 'it opens on k = 0, not playing'
    rail = page.locator('.plotly-graph-div .slider-rail-touch-rect').first  # the rect that takes the pointer
    rail.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    box = rail.bounding_box()
    rail.click(position=dict(x=box['width'] * 0.7, y=box['height'] / 2), force=True)  # k = 7 of 10
    page.wait_for_function("() => [...document.querySelectorAll('.plotly-graph-div')].find(g => g.layout.sliders)"
                           ".layout.sliders[0].active === 7", timeout=10_000)
    title, _, marks = page.evaluate(state)
    assert 'step k = 7 of 10' in title and set(marks) == {7}, (title, marks)

def test_widgets_drawn_from_their_state():
    """A dashboard as nbclient stores it (a Tab of an Output with a figure and a hidden slider, a Dropdown) drawn as
    static HTML."""
    docs = _docs()
    fig = {'data': [{'type': 'bar', 'y': [1, 2]}], 'layout': {'title': {'text': 'in a tab'}}}
    W = lambda name, **st: {'model_name': name, 'model_module': '@jupyter-widgets/controls', 'state': st}
    state = {'tab': W('TabModel', children=['IPY_MODEL_out', 'IPY_MODEL_box'], titles=['training', 'calibration'],
                      selected_index=0),
             'out': W('OutputModel',
                      outputs=[{'output_type': 'display_data', 'data': {docs.PLOTLY_MIME: fig}, 'metadata': {}}]),
             'box': W('VBoxModel', children=['IPY_MODEL_hidden', 'IPY_MODEL_run']),
             'hidden': W('IntSliderModel', value=0, min=0, max=0, description='round', layout='IPY_MODEL_lay'),
             'lay': W('LayoutModel', display='none'),
             'run': W('DropdownModel', _options_labels=['dense', 'turning_point'], index=1, description='run')}
    html = docs.widget_html('tab', state)
    assert (html.count("<button class='w-tab-head") == 2 and '>training</button>' in html
            and '>calibration</button>' in html)
    assert 'Plotly.newPlot' in html and 'in a tab' in html  # the figure, drawn with the page's plotly.js
    assert 'round' not in html  # a hidden control is not drawn
    assert "<label>run</label> <span class='w-value'>turning_point</span>" in html

# --- figures read without guessing: titles that neither collide nor are cut, at the docs' output width ---

FIG_PX = 848  # the width of a notebook's output area in JupyterLab at a 1280-px window (the measure)
RUN = ROOT/'results'/'study'/'runs'/'geneval'/'seed0'  # committed runs: metrics, calibration, no checkpoints

def _figures() -> dict:
    """gain_figure of one group of the shipped model (as the quickstart, 07_viz and the app's Credit tab draw it), the
    training dashboard, psi by round, gradient by step."""
    import torch
    from flowgrpo_nb.task import load_task, load_policy
    from flowgrpo_nb.rollout import RolloutConfig, rollout, step_values
    from flowgrpo_nb.credit import method_credits
    from flowgrpo_nb.viz import gain_figure, training_figure, calibration_figure, grad_share_figure
    torch.set_num_threads(1)
    policy, task = load_policy('tiny'), load_task('partial')
    ro = rollout(policy, ['a red circle and a blue square'], RolloutConfig(K=6, group_size=4, sampler='flow_sde'),
                 task.reward, torch.Generator().manual_seed(0))
    values = {op: step_values(policy, ro, op, task.reward) for op in ('tweedie', 'ode:rest')}
    return dict(gain=gain_figure(ro, method_credits(ro, values)), training=training_figure(RUN/'dense'),
                calibration=calibration_figure(RUN/'dense_calib'), gradient=grad_share_figure(RUN/'dense'))

@pytest.mark.chrome
def test_figure_titles_neither_collide_nor_are_cut(chromium, tmp_path):
    from plotly.offline import get_plotlyjs
    figs = _figures()
    body = ''.join(f"<div class='fig' id='{k}'>{f.to_html(full_html=False, include_plotlyjs=False)}</div>"
                   for k, f in figs.items())
    page_file = tmp_path/'figures.html'
    page_file.write_text(f"<html><head><meta charset='utf-8'><script>{get_plotlyjs()}</script></head>"
                         f"<body style='margin:0'><div style='width:{FIG_PX}px'>{body}</div></body></html>")
    boxes = """id => { const d = document.getElementById(id),
                             svg = d.querySelector('.main-svg').getBoundingClientRect();
        const r = e => { const b = e.getBoundingClientRect();
                         return [e.textContent, b.left, b.top, b.right, b.bottom]; };
        return {svg: [svg.left, svg.top, svg.right, svg.bottom],
                texts: [...d.querySelectorAll('.annotation-text, .gtitle, .xtitle, .ytitle')]
                           .filter(e => e.textContent.trim()).map(r),
                xticks: [...d.querySelectorAll('.xtick text')].map(e => e.textContent)}; }"""
    page = chromium.new_page(viewport=dict(width=1280, height=800))
    page.route('**/*', lambda r: r.continue_() if r.request.url.startswith('file:') else r.abort())
    page.goto(page_file.as_uri(), wait_until='load')
    page.wait_for_function(f'document.querySelectorAll(".main-svg").length >= {len(figs)}', timeout=60_000)
    drawn = {k: page.evaluate(boxes, k) for k in figs}
    page.screenshot(path=str(tmp_path/'figures.png'), full_page=True)
    overlap = lambda a, b: min(a[3], b[3]) - max(a[1], b[1]) > 1 and min(a[4], b[4]) - max(a[2], b[2]) > 1
    for k, d in drawn.items():
        texts, (left, top, right, bottom) = d['texts'], d['svg']
        assert texts, k
        clashes = [(a[0], b[0]) for i, a in enumerate(texts) for b in texts[i + 1:] if overlap(a, b)]
        assert not clashes, (k, clashes)
        cut = [t[0] for t in texts if t[1] < left - 1 or t[3] > right + 1 or t[2] < top - 1]
        assert not cut, (k, cut, d['svg'])
    assert any('one update per batch' in t[0] for t in drawn['training']['texts']), 'the empty panels say why'
    assert all(t.lstrip('−-').isdigit() for t in drawn['gradient']['xticks'] + drawn['calibration']['xticks']), \
        (drawn['gradient']['xticks'], drawn['calibration']['xticks'])  # whole steps on step axes
