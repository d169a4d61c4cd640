"""A real browser draws the quickstart tutorial's plotly figures.

The notebook is executed with a Jupyter kernel (nbclient) and exported to HTML with nbconvert, with plotly.js
inlined from the installed plotly package (the machine has no network, so nothing may come from a CDN). Debian's
Chromium, driven by Playwright, opens the page; every figure must have drawn its SVG, and a screenshot is saved."""
import re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path('/usr/bin/chromium')
ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking']
OFFLINE = 'import plotly.io as pio; pio.renderers.default = "notebook"  # plotly.js inlined from the local package'

def executed_html(nb_path:Path, out_dir:Path) -> tuple[Path, int]:
    "Execute `nb_path` with plotly's offline renderer; write its HTML export; return (path, number of figures)."
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter
    nb = nbformat.read(nb_path, as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if 'pio.renderers.default' in c.source)
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(OFFLINE))
    NotebookClient(nb, timeout=600, kernel_name='python3', resources={'metadata': {'path': str(out_dir)}}).execute()
    n_figs = sum(len(re.findall(r'<div id="[^"]+" class="plotly-graph-div"', str(o.get('data', {}).get('text/html', ''))))
                 for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', []))
    html, _ = HTMLExporter(template_name='lab').from_notebook_node(nb)
    path = out_dir/f'{nb_path.stem}.html'
    path.write_text(html)
    return path, n_figs

@pytest.mark.chrome
def test_quickstart_figures_draw(tmp_path, monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')  # the kernel inherits it: the CPUs are shared
    if not CHROMIUM.exists(): pytest.skip('needs Debian chromium at /usr/bin/chromium (apt-get install -y chromium)')
    pw = pytest.importorskip('playwright.sync_api', reason='needs the playwright python package')
    path, n_figs = executed_html(ROOT/'nbs'/'tutorials'/'quickstart.ipynb', tmp_path)
    html = path.read_text()
    assert n_figs >= 5, f"expected the quickstart's figures in the export, found {n_figs}"
    assert not re.search(r'<script[^>]+src="https?://[^"]*plotly', html), 'plotly.js must be inlined, not loaded from a CDN'
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport=dict(width=1300, height=900))
        errors = []
        page.on('pageerror', lambda e: errors.append(str(e)))
        page.goto(path.as_uri(), wait_until='load')
        page.wait_for_function(f'document.querySelectorAll(".js-plotly-plot .main-svg").length >= {n_figs}', timeout=60_000)
        plots = page.locator('.js-plotly-plot').count()
        svgs = page.locator('.main-svg').count()
        shot = tmp_path/'quickstart.png'
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    print(f'\n{plots} plotly figures drew {svgs} .main-svg elements; screenshot: {shot}')
    assert plots >= n_figs and svgs >= n_figs, (plots, svgs, n_figs)
    assert not errors, errors
    assert shot.stat().st_size > 10_000
